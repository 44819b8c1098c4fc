"""Study 3 from parameters to findings, in the order the notebook used to run it: the models, the cost ratios
(F3.3), the verify and rollback costs, the generation sweep (F3.1, F3.2), the controlled-acceptance sweep at the
seed's shapes, the map of where speculation pays, the verdicts. Every table is written as it is made."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.models import load_model
from servelab.studies.common.quiet import quiet_run
from servelab.studies.common.style import use_book_style
from servelab.studies.s03_speculative import controlled, report, verdicts
from servelab.studies.s03_speculative.cost_ratio import (
    cost_ratios,
    hf_crop_cost,
    rollback_cost,
    step_costs,
    verify_cost,
)
from servelab.studies.s03_speculative.pair import load_model_set, paged_models
from servelab.studies.s03_speculative.params import max_gamma
from servelab.studies.s03_speculative.study import generation_sweep, pays_map, speedup_table


@dataclass
class StudyRun:
    P: dict
    device_name: str
    res: StudyResults
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list = field(default_factory=list)
    ms: object = None
    seconds: float = 0.0

    def __getattr__(self, name):  # R.speed, R.controlled, …: the tables by name
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def models(P: dict, device: str):
    """The trained family (or the specs given); a random tiny pair if training fails, said loudly."""
    try:
        return load_model_set(
            P["target"], P["drafts"], profile=P["profile"], dtype=P["dtype"], device=device, progress=False
        )
    except Exception as e:  # noqa: BLE001 — keep the cost-ratio study (F3.3) alive
        if P["target"] is not None:
            raise
        print(
            f"WARNING: the trained family could not be built ({type(e).__name__}: {e}); random tiny models "
            "stand in, whose acceptance says nothing about real drafts (F3.1 and F3.2 are then void)"
        )
        ms = load_model_set(
            "config:tiny-llama", ["config:tiny-llama"], profile=P["profile"], dtype=P["dtype"], device=device
        )
        ms.source = "random-weight fallback (training failed)"
        return ms


def shape_costs(P: dict, device: str, roof) -> list[pd.DataFrame]:
    """One decode step of each of the seed's shapes (random weights), per execution mode."""
    out = []
    for spec in dict.fromkeys(s for pair in P["shape_pairs"] for s in pair):
        m = None
        try:
            m = load_model(spec, dtype=P["dtype"], device=device, load_tokenizer=False).model
            out.append(
                step_costs(
                    {spec.removeprefix("config:"): m},
                    P["cost_modes"],
                    context=P["cost_context"],
                    roofline=roof,
                    repeats=P["cost_repeats"],
                    progress=False,
                )
            )
        except Exception as e:  # noqa: BLE001 — a model that does not load is a row, not a dead notebook
            out.append(pd.DataFrame([dict(model=spec, status=f"error: {type(e).__name__}: {e}"[:200])]))
        finally:
            del m
            _free(device)
    return out


def costs(R: StudyRun, device: str, roof) -> None:
    """F3.3's tables: step costs of the family and of the seed's shapes, and the cost ratios per pair and mode."""
    P, ms = R.P, R.ms
    steps = [
        step_costs(
            ms.hf, P["cost_modes"], context=P["cost_context"], roofline=roof, repeats=P["cost_repeats"], progress=False
        )
    ]
    steps = pd.concat(steps + shape_costs(P, device, roof), ignore_index=True)
    pairs = ms.pairs(P["middle_target"]) + [
        (d.removeprefix("config:"), t.removeprefix("config:")) for d, t in P["shape_pairs"]
    ]
    _put(R, "step_costs", steps)
    _put(R, "cost_ratios", cost_ratios(steps, pairs))


def _put(R: StudyRun, name: str, df: pd.DataFrame) -> None:
    R.tables[name] = df
    R.res.write(name, df)


def generation(R: StudyRun) -> None:
    """Verify and rollback costs, then the generation sweep and its speedup table (F3.1, F3.2)."""
    P, ms = R.P, R.ms
    gmax = max(max_gamma(P["gammas"]), max(P["verify_rows"]) - 1)
    max_len = max(P["prompt_len"] + P["max_new_tokens"], P["cost_context"]) + max(gmax, P["chain_steps"]) + 2
    pairs_run = ms.pairs(P["middle_target"])
    lms = paged_models(ms, max_len, gmax, targets={t for _, t in pairs_run})
    _put(R, "verify_cost", verify_cost(lms[ms.target], P["cost_context"], P["verify_rows"], repeats=P["cost_repeats"]))
    drops = [1, 4, 8]
    _put(R, "rollback_cost", rollback_cost(lms[ms.target], P["cost_context"], drops))
    _put(R, "hf_crop_cost", hf_crop_cost(ms.hf[ms.target], P["cost_context"], drops).assign(model=ms.target))
    prompts = ms.prompts(P["num_prompts"], P["prompt_len"], seed=P["seed"])
    sweep = generation_sweep(
        lms,
        pairs_run,
        prompts,
        P["gammas"],
        P["temperatures"],
        P["max_new_tokens"],
        warmup=P["warmup"],
        repeats=P["repeats"],
        seed=P["seed"],
        time_budget_s=P["time_budget_s"],
        chain_steps=P["chain_steps"] or None,
        progress=False,
    )
    R.tables["generations"] = sweep
    R.res.write("generations", sweep.drop(columns=["output"], errors="ignore"))
    ratios = R.tables["cost_ratios"]
    eng = ratios[ratios["mode"] == "engine"].set_index(["draft", "target"]).c.to_dict()
    _put(R, "speedup", speedup_table(sweep, eng))
    for lm in lms.values():
        lm.reset()


def controlled_curves(R: StudyRun, device: str) -> None:
    """The controlled-acceptance sweep at the seed's shapes, and the α above which each pair pays per batch."""
    _free(device)
    raw = controlled.controlled_sweep(R.P, device, progress=False)
    R.tables["controlled_raw"] = raw
    R.res.write("controlled_raw", raw)
    table = controlled.controlled_table(raw)
    _put(R, "controlled_acceptance", table)
    R.tables["controlled"] = table
    _put(R, "controlled_pays", controlled.break_even_alpha(table))


def pays_grid(R: StudyRun) -> None:
    """The map of the best predicted speedup over α × c, with the measured pairs' points."""
    ratios, speed = R.tables["cost_ratios"], R.tables["speedup"]
    shape_pair = tuple(s.removeprefix("config:") for s in R.P["shape_pairs"][0])
    shape_ratios = ratios[ratios.target == shape_pair[1]]
    greedy = speed[speed.temperature == speed.temperature.min()]
    pts = greedy.groupby(["draft", "target"]).agg(alpha=("alpha", "median"), c=("c", "first")).reset_index()
    c_top = np.nanmax(
        [1.2, 1.1 * pts.c.max() if len(pts) else 0, 1.1 * shape_ratios.c.max() if len(shape_ratios) else 0]
    )
    R.tables["pays_grid"] = pays_map(np.linspace(0.0, 1.0, 51), np.linspace(0.02, c_top, 60))
    R.tables["pays_points"], R.tables["shape_ratios"] = pts, shape_ratios


def findings(R: StudyRun) -> None:
    P, speed = R.P, R.tables["speedup"]
    gen = R.tables["generations"]
    ok = gen[(gen.status == "ok") & (gen.method == "speculative")] if "method" in gen else gen.iloc[:0]
    kv_share = 100 * ok.rollback_ms.sum() / ok.ms.sum() if len(ok) else float("nan")
    shape_pair = tuple(s.removeprefix("config:") for s in P["shape_pairs"][0])
    seed_pair = tuple(s.removeprefix("config:") for s in P["controlled_pairs"][0])
    seed_shapes = verdicts.seed_pair_pays(R.tables["controlled_pays"], seed_pair)
    fam, shapes = report.family_tested_on(R.ms), report.shapes_tested_on(P)
    R.findings = [
        verdicts.f31(
            speed,
            kv_share,
            f"{R.ms.source}, target {R.ms.target}",
            R.device_name,
            tested_on=fam,
            seed_shapes=seed_shapes,
        ),
        verdicts.f32(speed, tested_on=fam, controlled=R.tables["controlled"]),
        verdicts.f33(R.tables["cost_ratios"], shape_pair, tested_on=shapes, seed_shapes=seed_shapes),
    ]
    R.res.write_findings([f.row() for f in R.findings])


def run_study(P: dict) -> StudyRun:
    """Everything Study 3 measures, written under ``03_speculative/``; the tables and findings returned, quietly
    (``common.quiet``; transformers' loading bars off: the trained family's checkpoints would draw one each)."""
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    from transformers.utils import logging

    logging.disable_progress_bar()
    with quiet_run():
        return _run(P)


def _run(P: dict) -> StudyRun:
    t0 = time.perf_counter()
    dev = device_record()
    ceil = measure_ceilings()
    res = StudyResults("03_speculative", dev, P, ceil)
    device = "cuda" if dev.kind == "cuda" else "cpu"
    R = StudyRun(P, dev.name, res)
    R.ms = models(P, device)
    if device == "cpu":
        torch.set_num_threads(1)  # smoke: tiny models on a small shared CPU, where intra-op threads only contend
    if R.ms.family is not None:
        _put(R, "family", R.ms.family.summary())
    costs(R, device, Roofline.from_ceilings(ceil))
    generation(R)
    controlled_curves(R, device)
    pays_grid(R)
    findings(R)
    R.seconds = time.perf_counter() - t0
    res.finish()
    return R
