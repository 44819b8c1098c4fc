"""Study 6 from parameters to findings in one call: ``run_study(P) -> Study6``.

Order: the models (SmolLM2 and its distilled drafts; the distillation's own budget is spent before the study's
clock starts); then, on the study's clock, the fixed-size work: HF's cost ratio at the seed's shapes and α with
bootstrap intervals for every draft (distilled, self-drafts, prompt lookup) on held-out prompts; then the timed
sweep of HF generate (plain, assisted, prompt lookup) and the project's engine on the same pairs, in what the
wall-time budget leaves; the verdicts. Every table is written to the study's results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from servelab.studies.common.budget import Budget
from servelab.studies.common.style import use_book_style
from servelab.studies.s06_hf_assisted import analysis, verdicts
from servelab.studies.s06_hf_assisted.params import REPORT_RESERVE_S, pairs_for


@dataclass
class Study6:
    P: dict
    device: object
    results: object  # StudyResults
    models: object  # StudyModels
    pairs: list
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    gen: dict = field(default_factory=dict, repr=False)  # {(prompt index, Job): GenerationRun} of the sweep
    prompts: list = field(default_factory=list, repr=False)  # the sweep's prompts (token ids)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def run_study(P: dict, *, progress: bool = False) -> Study6:
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    import torch

    from servelab.measure import device_record, measure_ceilings
    from servelab.measure.results import StudyResults
    from servelab.studies.s06_hf_assisted.models import load_study_models

    dev = device_record()
    if dev.kind == "cpu":
        torch.set_num_threads(1)  # a shared CPU: one intra-op thread avoids OpenMP contention
    t0 = time.monotonic()
    M = load_study_models(
        P["target"], P["drafts"], profile=P["profile"], dtype=P["dtype"], device=dev.kind, progress=progress
    )
    S = Study6(P, dev, StudyResults("06_hf_assisted", dev, P, measure_ceilings()), M, _pairs(M))
    S.timings["models_s"] = time.monotonic() - t0  # distillation (when not cached) and loading: not the study's clock
    deadline = Budget(P["wall_budget_s"])
    _seed_costs(S)  # fixed-size work first: the sweep then takes what the budget leaves
    _real_alpha(S)
    _sweep(S, deadline, progress)
    S.tables["alpha"] = _sweep_alpha(S)
    _analyse(S)
    S.timings["study_s"] = deadline.elapsed_s()
    for name, df in S.tables.items():
        S.results.write(name, df)
    S.results.write_findings([f.row() for f in S.findings])
    S.results.write_json("timings", S.timings)
    return S


def _pairs(M) -> list:
    """Each draft → the target, then the smallest draft → the largest (a draft as a middle-sized target)."""
    return pairs_for(M.target, M.drafts)


def _sweep(S: Study6, deadline: Budget, progress: bool) -> None:
    from servelab.studies.s06_hf_assisted.own import OwnSpeculative, own_available
    from servelab.studies.s06_hf_assisted.runs import assistant_settings, times_at_lengths
    from servelab.studies.s06_hf_assisted.sweep import sweep

    P, M = S.P, S.models
    prompts = M.prompts(P["n_prompts"], P["prompt_tokens"], seed=P["seed"])
    runner = None
    if P["own"] and own_available()[0]:
        longest = max(len(p) for p in prompts)
        runner = OwnSpeculative.sized(M.hf, S.pairs, longest, P["max_new_tokens"], gamma=P["own_gamma"])
    S.results.write_json("assistant_settings", assistant_settings(M.hf[M.drafts[0]]))
    runs, gen = sweep(
        M.hf,
        S.pairs,
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
        progress=progress,
    )
    S.tables["runs"] = runs
    S.tables["times"] = times_at_lengths(gen, P["lengths"])
    S.gen, S.prompts = gen, prompts


def _sweep_alpha(S: Study6) -> pd.DataFrame:
    """The teacher-forced α of each timed pair on the sweep's own outputs, per prompt."""
    from servelab.studies.s06_hf_assisted.acceptance import alpha_table

    return alpha_table(S.models.hf, S.pairs, S.prompts, S.gen, sdpa=S.P["hf_sdpa"])


def _real_alpha(S: Study6) -> None:
    """α of every draft (distilled, self-drafts, prompt lookup) on held-out prompts, with bootstrap 95% intervals:
    the real pair only."""
    P, M = S.P, S.models
    if M.distilled is None:
        return
    from servelab.spec.prompt_lookup import PromptLookupProposer
    from servelab.spec.self_draft import self_draft
    from servelab.studies.common.drafts.distill import eos_ids
    from servelab.studies.common.drafts.generate import continuations
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.s03_speculative.real_acceptance import real_acceptance

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
    S.tables["real_alpha"] = real_acceptance(
        drafts, prompts, refs, target_name=M.target, kinds=kinds, gamma=P["own_gamma"], seed=P["seed"]
    )


def _seed_costs(S: Study6) -> None:
    from servelab.studies.s06_hf_assisted.seed_costs import seed_shape_costs

    P = S.P
    S.tables["seed_costs"] = seed_shape_costs(
        P["seed_cost_pairs"], device=S.device.kind, dtype=P["dtype"], tokens=P["cost_tokens"], sdpa=P["hf_sdpa"]
    )


def _analyse(S: Study6) -> None:
    P, t = S.P, S.tables
    per_prompt = analysis.speedups(t["times"])
    t["speedups"] = analysis.summarize_speedups(per_prompt)
    t["coverage"] = analysis.coverage(t["runs"], t["times"], P["lengths"])
    t["decode_costs"] = analysis.decode_costs(t["runs"], S.models.hf)
    t["pairs"] = analysis.pair_summary(S.pairs, t["decode_costs"], t["speedups"], t["alpha"], t["runs"], P["lengths"])
    t["match_rates"] = analysis.match_rates(t["runs"])
    t["own_vs_engine"] = analysis.own_vs_engine(t["times"])
    t["own_acceptance"] = analysis.own_acceptance(t["runs"])
    S.findings = verdicts.findings(
        t["pairs"],
        per_prompt,
        t["seed_costs"],
        tested_on=S.models.tested_on(P["dtype"]) + "; HF generate, greedy, batch 1",
        min_prompts=verdicts.min_prompts_for(P["profile"], P["n_prompts"]),
    )
