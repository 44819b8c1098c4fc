"""Study 3's measuring path, in parts that each fit well under 9 minutes on the H200. It writes raw tables only; the
speedup, cost-ratio, controlled and lookup tables, the verdicts and the figures are the reporting path's
(``tables.py``, ``verdicts.py``, ``report.py``).

Parts (``P["part"]``; ``"all"`` runs every one into one folder, the smoke profile's way):

- ``costs``: one decode step of each of the seed's shapes (random weights, ``shape_pairs``) in each execution mode,
  the two models of a pair loaded together and their steps alternated (``paired_step_costs``), F3.3's cost ratio;
- ``real``: the trained target SmolLM2-135M-Instruct and drafts distilled from it on this GPU within the part
  (``studies.common.drafts.distill``; recipe and timings in ``distill``): their step costs, the verify and rollback
  costs, the generation sweep over ``num_prompts`` held-out chat prompts (``generations``, F3.1 and F3.2) and α of
  every proposer teacher-forced on the same prompts (``real_alpha``: distilled drafts, self-drafts, prompt lookup);
- ``controlled_*``: the controlled-acceptance sweep at the seed's shapes (``controlled_raw``), one pair (and some of
  its batch sizes) per part (``CONTROLLED_PARTS``);
- ``lookup``: prompt lookup's tokens/s in the batched loop on SmolLM2 (``lookup_raw``).
"""

from __future__ import annotations

import gc
import hashlib
import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.models import load_model
from servelab.models.shape import ModelShape
from servelab.studies.common.quiet import quiet_run

STUDY = "03_speculative"
# part -> expected minutes on the H200 with the process start (the plan's guess before a run records its own)
PARTS = {
    "costs": 2.0,
    "real": 7.0,
    "lookup": 2.5,
    "controlled_qwen2": 4.0,
    "controlled_llama8b": 4.0,
    "controlled_llama8b_b32": 4.5,
    "controlled_gpt2": 3.5,
}
# controlled part -> (the target's config name, the batch sizes it runs; None: every one of P["batches"])
CONTROLLED_PARTS = {
    "controlled_qwen2": ("qwen2-1.5b", None),
    "controlled_llama8b": ("llama-3-8b", (1, 8)),
    "controlled_llama8b_b32": ("llama-3-8b", (32,)),
    "controlled_gpt2": ("gpt2-medium", None),
}
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def controlled_params(P: dict, part: str) -> dict:
    """``P`` narrowed to one controlled part: its pair and batch sizes (``"all"``: unchanged)."""
    if part == "all":
        return P
    target, batches = CONTROLLED_PARTS[part]
    pairs = [p for p in P["controlled_pairs"] if p[1].removeprefix("config:") == target]
    keep = [b for b in P["batches"] if batches is None or b in batches]
    return P | dict(controlled_pairs=pairs, batches=keep or list(P["batches"]))


def _costs(P: dict, device: str, roof: Roofline | None, res: StudyResults) -> None:
    """Each shape pair's two models loaded together, their steps timed in pairs (``paired_step_costs``)."""
    from servelab.studies.s03_speculative.cost_ratio import paired_step_costs

    out = []
    for pair in P["shape_pairs"]:
        models = []
        try:
            for spec in pair:
                m = load_model(spec, dtype=P["dtype"], device=device, load_tokenizer=False).model
                models.append((spec.removeprefix("config:"), m))
            kw = dict(
                context=P["cost_context"],
                roofline=roof,
                repeats=P["cost_repeats"],
                engine_compile=P["cost_engine_compile"],
            )
            out.append(paired_step_costs(*models, P["cost_modes"], **kw).assign(role="shape"))
        except Exception as e:  # noqa: BLE001 — a pair that does not load is a row per model, not a dead run
            status = f"error: {type(e).__name__}: {e}"[:200]
            out.append(pd.DataFrame([dict(model=spec, role="shape", status=status) for spec in pair]))
        finally:
            models.clear()
            m = None
            _free(device)
    res.write("shape_steps", pd.concat(out, ignore_index=True))


def _smollm2_dequantized() -> None:
    """Build SmolLM2's dequantized copy of its GGUF (cached) before any part loads it, with the stderr of that one
    step dropped: ``transformers`` draws a tqdm bar there that no logging setting turns off, and a notebook would show
    it. The loads after it read the cache and draw nothing; a failure still raises (``GGUFError``)."""
    import contextlib
    import io

    from servelab.models.gguf import dequantized_dir
    from servelab.models.loader import smollm2_gguf

    with contextlib.redirect_stderr(io.StringIO()):
        dequantized_dir(smollm2_gguf())


def _digest(tokens) -> str:
    return hashlib.sha256(" ".join(map(str, tokens)).encode()).hexdigest()[:16]


def _real_models(P: dict, device: str, res: StudyResults):
    """(ModelSet, tokenizer, distilled drafts or None): SmolLM2 with drafts distilled now (``target`` None), else the
    specs given (random weights for ``config:`` specs)."""
    from servelab.models.loader import SMOLLM2
    from servelab.studies.common.drafts.distill import RECIPES, distill_drafts
    from servelab.studies.common.family.train import quiet_transformers
    from servelab.studies.s03_speculative.pair import ModelSet, load_model_set

    if P["target"] is not None:
        ms = load_model_set(P["target"], P["drafts"], profile=P["profile"], dtype=P["dtype"], device=device)
        return ms, None, None
    recipe = replace(RECIPES[P["profile"]], seed=P["seed"])
    if P.get("draft_layers"):
        recipe = replace(recipe, draft_layers=tuple(P["draft_layers"]))
    t0 = time.perf_counter()
    dd = distill_drafts(SMOLLM2, P["profile"], device=device, recipe=recipe)
    distill_s = time.perf_counter() - t0
    summary = dd.summary().assign(cached=dd.cached, wall_s=distill_s, **{k: float(v) for k, v in dd.timings.items()})
    res.write("distill", summary)
    res.write_json("distill_recipe", asdict(recipe) | dict(target=SMOLLM2, data=dd.data))
    with quiet_transformers():
        lm = load_model(SMOLLM2, dtype=P["dtype"], device=device)
        hf = {SMOLLM2_NAME: lm.model}
        for name, path in dd.drafts.items():
            hf[name] = load_model(str(path), dtype=P["dtype"], device=device, load_tokenizer=False).model
    return ModelSet(SMOLLM2_NAME, hf, "SmolLM2 with distilled drafts", None, "held-out chat prompts"), lm.tokenizer, dd


def _real(P: dict, device: str, roof: Roofline | None, res: StudyResults) -> None:
    from servelab.speculative.prompt_lookup import PromptLookupProposer
    from servelab.speculative.self_draft import self_draft
    from servelab.studies.common.drafts.distill import eos_ids
    from servelab.studies.common.drafts.generate import continuations
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.s03_speculative.cost_ratio import (
        hf_crop_cost,
        rollback_cost,
        step_costs,
        verify_config,
        verify_cost,
        verify_engine,
    )
    from servelab.studies.s03_speculative.pair import native_models
    from servelab.studies.s03_speculative.params import max_gamma
    from servelab.studies.s03_speculative.real_acceptance import real_acceptance
    from servelab.studies.s03_speculative.sweep import generation_sweep

    ms, tok, dd = _real_models(P, device, res)
    kinds = {n: ("target" if n == ms.target else "distilled" if dd is not None else "draft") for n in ms.hf}
    res.write(
        "models",
        pd.DataFrame(
            [
                dict(model=n, role=kinds[n], params=ModelShape.from_config(m.config).params, source=ms.source)
                for n, m in ms.hf.items()
            ]
        ),
    )
    kw = dict(
        context=P["cost_context"],
        roofline=roof,
        repeats=P["cost_repeats"],
        progress=False,
        engine_compile=P["cost_engine_compile"],
    )
    res.write("step_costs", step_costs(ms.hf, P["cost_modes"], **kw).assign(role="real"))
    if tok is not None:
        prompts = encode_chat(tok, chat_prompts("heldout", P["num_prompts"], seed=P["seed"]))
    else:
        prompts = ms.prompts(P["num_prompts"], P["prompt_len"], seed=P["seed"])
    gmax = max_gamma(P["gammas"])
    longest = max(max(map(len, prompts)), P["cost_context"])
    max_len = longest + P["max_new_tokens"] + max(gmax, P["chain_steps"]) + 2
    pairs = ms.pairs(P["middle_target"])
    verify = dict(warmup=3, repeats=P["cost_repeats"])
    costs = verify_config(P["cost_context"], P["verify_rows"], **verify)
    native = native_models(ms, max(max_len, costs.max_model_len) + 16)
    target = verify_engine(native[ms.target], costs, P["verify_rows"])
    res.write("verify_cost", verify_cost(target, ms.target, P["cost_context"], P["verify_rows"], **verify))
    res.write("rollback_cost", rollback_cost(target, ms.target, P["cost_context"], [1, 4, 8]))
    del target
    res.write("hf_crop_cost", hf_crop_cost(ms.hf[ms.target], P["cost_context"], [1, 4, 8]).assign(model=ms.target))
    sweep = generation_sweep(
        native,
        pairs,
        prompts,
        P["gammas"],
        P["temperatures"],
        P["max_new_tokens"],
        max_model_len=max_len,
        warmup=P["warmup"],
        repeats=P["repeats"],
        seed=P["seed"],
        time_budget_s=P["time_budget_s"],
        chain_steps=P["chain_steps"] or None,
        progress=False,
    )
    if "output" in sweep:  # the tokens themselves are not kept: a digest says whether two generations agree
        sweep["output"] = sweep["output"].map(lambda s: _digest(s.split()) if isinstance(s, str) else s)
    res.write("generations", sweep)
    del native
    _free(device)
    # α of every proposer, teacher-forced on the target's greedy answers to the same prompts
    target_hf = ms.hf[ms.target]
    drafts = {n: m for n, m in ms.hf.items() if n != ms.target}
    layers = dd.recipe.draft_layers if dd is not None else ()
    for k in layers:
        drafts[f"self-{k}L"], kinds[f"self-{k}L"] = self_draft(target_hf, k), "self"
    drafts["prompt-lookup"], kinds["prompt-lookup"] = PromptLookupProposer(), "lookup"
    eos = eos_ids(target_hf, tok) if tok is not None else []
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else (eos or [0])[0]
    refs = continuations(target_hf, prompts, P["max_new_tokens"], eos_ids=eos, pad_id=pad, progress=False)
    alpha = real_acceptance(drafts, prompts, refs, target_name=ms.target, kinds=kinds, gamma=4, seed=P["seed"])
    res.write("real_alpha", alpha)


def _lookup(P: dict, device: str, res: StudyResults) -> None:
    from servelab.studies.s03_speculative.lookup_speed import smollm2_lookup_speed

    res.write("lookup_raw", smollm2_lookup_speed(P["profile"], device=device, seed=P["seed"]))


def _controlled(P: dict, device: str, res: StudyResults, part: str) -> None:
    from servelab.studies.s03_speculative.controlled_engine import controlled_sweep

    Pc = controlled_params(P, part)
    raw = controlled_sweep(Pc, device, progress=False) if Pc["controlled_pairs"] else pd.DataFrame()
    res.write("controlled_raw", raw)
    res.write_json("controlled_setting", {k: Pc[k] for k in ("controlled_pairs", "batches")})


def parts_of(part: str) -> list[str]:
    """The parts one run measures: ``part`` itself, or every part for ``"all"``."""
    if part == "all":
        return list(PARTS)
    if part not in PARTS:
        raise ParameterError(f"part must be 'all' or one of {sorted(PARTS)}, got {part!r}")
    return [part]


def measure(P: dict) -> Path:
    """Measure the part ``P["part"]`` of Study 3 (every part for ``"all"``); the run's folder."""
    todo = parts_of(P["part"])
    from transformers.utils import logging

    logging.disable_progress_bar()
    with quiet_run():
        dev = device_record()
        device = "cuda" if dev.kind == "cuda" else "cpu"
        if device == "cpu":
            import torch

            torch.set_num_threads(1)  # small models on a small shared CPU: intra-op threads only contend
        needs_roof = any(p in ("costs", "real") for p in todo)
        ceil = measure_ceilings() if needs_roof else None
        roof = Roofline.from_ceilings(ceil) if ceil is not None else None
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        if "lookup" in todo or ("real" in todo and P["target"] is None):
            _smollm2_dequantized()
        for part in todo:
            if part == "costs":
                _costs(P, device, roof, res)
            elif part == "real":
                _real(P, device, roof, res)
            elif part == "lookup":
                _lookup(P, device, res)
            elif P["part"] == "all" and part != next(p for p in PARTS if p.startswith("controlled")):
                continue  # "all": one controlled sweep over every pair and batch of P
            else:
                _controlled(P, device, res, P["part"])
            _free(device)
        res.finish()
        return res.dir
