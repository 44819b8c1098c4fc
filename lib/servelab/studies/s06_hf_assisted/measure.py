"""Study 6's measuring path: SmolLM2-135M-Instruct and drafts distilled from it (trained here, on the GPU, within the
part's time unless the drafts' cache already holds them), HF ``generate`` timed plain, with ``assistant_model`` and
with prompt lookup, the project's engine on the same pairs, and the drafts' greedy agreement (α) per prompt.

It writes raw tables only: ``runs`` (one row per planned generate, with its status), ``times`` (ms to each output
length, per prompt and method), ``alpha`` (teacher-forced α per prompt and timed pair), ``alpha_hits`` (every α
draft's per-position agreement with the target's greedy answer, per held-out prompt: Study 3's α and its interval
are computed from it at render time), ``seed_costs`` (HF's cost ratio at the seed's shapes, random weights),
``models`` (each model's size), ``distill`` and ``distill_loss`` (the drafts' recipe, training time and loss).
Speedups, cost ratios, verdicts and figures are the reporting path's (``report.py``).

A full run is split into parts by prompt (``PROMPT_PARTS``): every part trains (or loads) the same recipe's drafts and
times its own prompts, numbered globally; part ``p0`` also measures α and the seed's shapes. ``all`` does everything.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure.results import StudyResults
from servelab.studies.common.budget import Budget
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s06_hf_assisted.params import JOB_LIMIT_S, REPORT_RESERVE_S, pairs_for

STUDY = "06_hf_assisted"
# minutes on the H200 per part, a first guess before a run records its own: the drafts' distillation when not cached
# (~1 min of the target's answers, 60 s per draft), then 3 prompts × every method to 512 tokens in wall_budget_s
PARTS = {"p0": 8.5, "p1": 7.5, "p2": 7.5}
PROMPT_PARTS = {"p0": (0, 3), "p1": (3, 6), "p2": (6, 9)}  # [first, last) prompt of each part's sweep
ALPHA_PARTS = ("all", "p0")  # the parts that measure α on held-out prompts and the seed's shapes' costs


def part_prompts(part: str, n_prompts: int) -> tuple[int, int]:
    """The [first, last) prompt indices the part ``part`` times (``all``: every prompt)."""
    if part == "all":
        return 0, n_prompts
    if part not in PROMPT_PARTS:
        raise ParameterError(f"Study 6 has parts {sorted(PROMPT_PARTS)} (or 'all'), got {part!r}")
    lo, hi = PROMPT_PARTS[part]
    return min(lo, n_prompts), min(hi, n_prompts)


def model_sizes(models: dict, target: str) -> pd.DataFrame:
    """One row per model: role, parameters, layers, weight bytes."""
    rows = []
    for name, m in models.items():
        rows.append(
            dict(
                model=name,
                role="target" if name == target else "draft",
                params=sum(p.numel() for p in m.parameters()),
                layers=m.config.num_hidden_layers,
                weight_bytes=sum(p.numel() * p.element_size() for p in m.parameters()),
            )
        )
    return pd.DataFrame(rows)


def distill_tables(dd) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The distilled drafts' record: one row per draft (recipe, steps, tokens, training seconds, loss, cached or
    trained in this run) and the loss curve."""
    from dataclasses import asdict

    recipe = {f"recipe_{k}": (str(v) if isinstance(v, tuple) else v) for k, v in asdict(dd.recipe).items()}
    summary = dd.summary().assign(
        target=dd.target,
        cached=bool(dd.cached),
        generate_s=float(dd.timings.get("generate_s", float("nan"))),
        drafts_key=dd.dir.name,
        **{k: v for k, v in dd.data.items() if isinstance(v, (int, float, str))},
        **recipe,
    )
    return summary, dd.loss


def alpha_hits(M, P: dict) -> pd.DataFrame:
    """Per α draft (distilled, self-drafts, prompt lookup) and held-out prompt: its greedy agreement with the
    target's answer at every position, as a string of 0/1 (``real_acceptance`` summarizes it at render time)."""
    from servelab.speculative.prompt_lookup import PromptLookupProposer
    from servelab.speculative.self_draft import self_draft
    from servelab.studies.common.drafts.distill import eos_ids
    from servelab.studies.common.drafts.generate import continuations
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.s03_speculative.real_acceptance import greedy_agreement, lookup_agreement

    target = M.hf[M.target]
    drafts = {d: M.hf[d] for d in M.drafts}
    kinds = dict.fromkeys(drafts, "distilled")
    for k in P["self_layers"]:
        if k < target.config.num_hidden_layers:
            drafts[f"self-{k}L"], kinds[f"self-{k}L"] = self_draft(target, k), "self"
    drafts["prompt-lookup"], kinds["prompt-lookup"] = PromptLookupProposer(), "lookup"
    prompts = encode_chat(M.tokenizer, chat_prompts("heldout", P["alpha_prompts"], seed=P["seed"]))
    eos = eos_ids(target, M.tokenizer)
    refs = continuations(target, prompts, P["alpha_tokens"], eos_ids=eos, pad_id=M.pad_token_id)
    rows = []
    for i, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
        if not ref:
            continue
        for name, d in drafts.items():
            lookup = isinstance(d, PromptLookupProposer)
            h = lookup_agreement(d, prompt, ref) if lookup else greedy_agreement(d, prompt, ref)
            rows.append(dict(draft=name, target=M.target, kind=kinds[name], prompt=i, positions=len(h),
                             kept=int(sum(h)), hits="".join("1" if x else "0" for x in h)))  # fmt: skip
    return pd.DataFrame(rows, columns=["draft", "target", "kind", "prompt", "positions", "kept", "hits"])


def _sweep(M, pairs, P: dict, first: int, last: int, deadline: Budget, res: StudyResults) -> None:
    """The timed sweep over prompts [first, last) of the study's held-out prompts; prompt ids stay global."""
    from servelab.studies.s06_hf_assisted.acceptance import alpha_table
    from servelab.studies.s06_hf_assisted.own_engine import OwnEngineSpeculative
    from servelab.studies.s06_hf_assisted.runs import assistant_settings, times_at_lengths
    from servelab.studies.s06_hf_assisted.sweep import sweep

    prompts = M.prompts(P["n_prompts"], P["prompt_tokens"], seed=P["seed"])[first:last]
    runner = None
    if P["own"]:
        longest = max(len(p) for p in prompts)
        runner = OwnEngineSpeculative.sized(M.hf, pairs, longest, P["max_new_tokens"], gamma=P["own_gamma"])
    res.write_json("assistant_settings", assistant_settings(M.hf[M.drafts[0]]))
    runs, gen = sweep(
        M.hf,
        pairs,
        prompts,
        max_new_tokens=P["max_new_tokens"],
        cost_tokens=P["cost_tokens"],
        prompt_lookup_targets=[M.target],
        pld_tokens=P["prompt_lookup_num_tokens"],
        own=runner,
        budget_s=deadline.sweep_budget_s(REPORT_RESERVE_S, P["budget_s"]),
        short_new_tokens=P["short_new_tokens"],
        pad_token_id=M.pad_token_id,
        sdpa=P["hf_sdpa"],
        progress=False,
    )
    times = times_at_lengths(gen, P["lengths"])
    alpha = alpha_table(M.hf, pairs, prompts, gen, sdpa=P["hf_sdpa"])
    for df in (runs, times, alpha):
        if "prompt" in df:
            df["prompt"] = df["prompt"] + first
    res.write("runs", runs)
    res.write("times", times)
    res.write("alpha", alpha)


def measure(P: dict) -> Path:
    """Train (or load) the drafts, then measure this part's prompts, α and the seed's shapes; the run's folder."""
    started = time.monotonic()
    with quiet_run():
        import torch

        from servelab.measure import device_record, measure_ceilings
        from servelab.studies.s06_hf_assisted.models import load_study_models
        from servelab.studies.s06_hf_assisted.seed_costs import seed_shape_costs

        part = P.get("part", "all")
        first, last = part_prompts(part, P["n_prompts"])
        dev = device_record()
        if dev.kind == "cpu":
            torch.set_num_threads(1)  # a shared CPU: one intra-op thread avoids OpenMP contention
        res = StudyResults(STUDY, dev, P, measure_ceilings(), measuring=__name__)
        t0 = time.monotonic()
        M = load_study_models(P["target"], P["drafts"], profile=P["profile"], dtype=P["dtype"], device=dev.kind,
                              progress=False)  # fmt: skip
        timings = {"models_s": time.monotonic() - t0}  # distillation (when not cached) and loading
        res.write("models", model_sizes(M.hf, M.target).assign(tested_on=M.tested_on(P["dtype"])))
        if M.distilled is not None:
            summary, loss = distill_tables(M.distilled)
            res.write("distill", summary)
            res.write("distill_loss", loss)
        # the part's own budget, cut where the drafts' distillation left less of the job's limit
        deadline = Budget(max(0.0, min(P["wall_budget_s"], JOB_LIMIT_S - (time.monotonic() - started))))
        pairs = pairs_for(M.target, M.drafts)
        if part in ALPHA_PARTS:
            res.write(
                "seed_costs",
                seed_shape_costs(
                    P["seed_cost_pairs"], device=dev.kind, dtype=P["dtype"], tokens=P["cost_tokens"], sdpa=P["hf_sdpa"]
                ),  # fmt: skip
            )
            if M.distilled is not None:
                res.write("alpha_hits", alpha_hits(M, P))
        if last > first:
            _sweep(M, pairs, P, first, last, deadline, res)
        timings["study_s"] = deadline.elapsed_s()
        res.write_json("timings", timings)
        res.finish()
        return res.dir
