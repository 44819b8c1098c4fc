"""The simulator page's reporting path: everything it shows, computed from files at every book build (``report``).

Inputs: Study 1's request records and step log (``sources.study1``), Study 2's timed steps, from which the GPU cost
models are fitted here (``sources.study2_steps``), Study 7's server runs (``study7_runs.study7``), and this study's own
runs (``measure.py``): the fresh held-out run of the real server, drawn after the cost model was frozen, and the
simulator's speed timed on the measuring host. From them: the calibration and the validation on Study 1's runs,
the GPU terms' ablation, the context reads, the Study 7 replay and the fresh run's held-out error beside it, the
capacity and routing predictions (simulated here, with ``SETTINGS``' sizes), and F2.3. No wall-clock number is
taken at render time: the speed is the measuring run's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.workload import Trace
from servelab.sim import capacity
from servelab.sim.prefix_workload import with_shared_prefixes
from servelab.sim.routers import ROUTERS
from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.markdown import format_value
from servelab.studies.common.published import published_section
from servelab.studies.common.repeats import MIN_REPEATS
from servelab.studies.common.runs import RunSet
from servelab.studies.common.tested_on import model_name
from servelab.studies.s08_simulator import (
    ablation,
    context_reads,
    freeze_record,
    fresh_drift,
    heldout,
    prefix_routing,
    replica_capacity,
    sources,
    study1_runs,
    study7_runs,
    validation,
    verdicts,
)
from servelab.studies.s08_simulator import ledger as ledger_mod
from servelab.studies.s08_simulator import params as params_mod
from servelab.studies.s08_simulator.plots import GOAL_PCT

STUDY = "08_simulator"
MISS_PCT = 20.0  # a Study 7 server run the simulator missed by more than this (median |error|) is explained
SENSITIVITY = [0.9, 1.0, 1.1]  # step-cost factors of that explanation
FRESH = "fresh"  # the measuring path's held-out parts: fresh_<model short name>
# the page's simulations (the measuring run does not size them: they are recomputed at every render, on a CPU)
SETTINGS = dict(
    capacity_model="config:qwen2-0.5b",
    **freeze_record.FIT,
    capacity_routers=list(ROUTERS),
    capacity_rate_multiples=[1, 2, 4, 8],
    capacity_duration_s=10.0,
    capacity_max_requests=240,
    slo_ttft_ms=None,
    slo_tpot_ms=None,
    max_replicas=32,
    prefix_groups=16,
    prefix_tokens=256,
    seed=0,
    affinity_prefixes=10,
    affinity_prefix_tokens=2048,
    affinity_suffix_tokens=64,
    affinity_output_tokens=32,
    affinity_replicas=4,
    affinity_pool_fractions=[0.33, 2.0],
    affinity_rate_multiples=[1, 2, 4],
    affinity_requests=240,
    replica_refine=2,  # each (router, N) capacity bracket to a factor of 2^(1/4) ...
    replica_requests=400,  # ... over Poisson traces of this many requests per replica
    rate_search_refine=1,  # the rate one replica sustains, to a factor of 2^(1/2): the rates' unit, not a claim
)


@dataclass
class Study8Page:
    """Everything the page shows; ``tables`` holds every table by name (``sim_validation`` …)."""

    runs: RunSet
    findings: list[Finding]
    P: dict = field(default_factory=lambda: dict(SETTINGS))
    source: str = ""  # where the real runs come from
    study1: bool = False
    s1_params: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    deadline_s: float | None = None
    gpu_notes: list[str] = field(default_factory=list)
    s1_slug: str | None = None
    s1_repeat: str = ""  # how Study 1's page names the repeat calibrated and validated here ("repeat 1 of 3")
    s1_partial: dict[str, list[str]] = field(default_factory=dict)  # Study 1's repeats lacking parts: name → parts
    s1_every: RunSet | None = None  # every repeat of Study 1, whole or not (the simulator reads the whole ones)
    f23_models: list[str] = field(default_factory=list)  # the models F2.3 reads (Study 2's costs), as named
    # a repeat left out for parts of other models only: F2.3's reading of its own models' runs there, name → (the
    # median |error| with the serving overheads, that repeat's verdict); shown beside the verdict, never in it
    s1_readings: dict[str, tuple[float, str]] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)  # model → {"gpu_only", "gpu+overheads"} cost models
    fitted_by_terms: dict = field(default_factory=dict)  # ablation variant → model → fitted cost models
    f23: Finding | None = None
    notes: list[str] = field(default_factory=list)  # what a part could not do, and why
    study7: object = None  # study7_runs.Study7Runs, when its runs could be replayed
    s7_repeat: str = ""  # how Study 7's page names the repeat replayed ("repeat 2 of 3")
    s7_cost: dict | None = None
    s7_runs: dict | None = None
    context: dict = field(default_factory=dict)
    cap: dict = field(default_factory=dict)
    aff: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)  # the measuring run's speed row ({} where none)
    fresh: dict = field(default_factory=dict)  # the fresh held-out run: error, runs, freeze check ({} where none)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())

    def table(self, name: str) -> pd.DataFrame | None:
        return self.tables.get(name)

    @property
    def device(self) -> str:
        return self.runs.device_name


# ---- F2.3 ----------------------------------------------------------------------------------------------------
def f23_not_measured(why: str) -> Finding:
    """F2.3 as inconclusive, "not measured", with ``why`` (its claim and seed value from the seed's claims)."""
    # the seed's claims list F2.3 under Study 2 (data/seed/claims.csv; tests/test_seed_constants.py reads them)
    return next(f for f in not_measured("02_gpu_costs", why) if f.id == "F2.3")


def _with_fresh(f: Finding, fresh: dict) -> Finding:
    """F2.3 with the fresh held-out run's error beside the verdict, or why there is none: the verdict rests on Study
    1's runs held out from the fit, and the note says whether a run drawn after the freeze stands beside it."""
    if fresh.get("error"):
        said = f"; the held-out run drawn after the cost model was frozen was not evaluated: {fresh['error']}"
        return replace(f, note=f.note + said)
    if not fresh:
        # not "fresh": the Evidence cell beside this note says "fresh" of data measured by today's code
        return replace(
            f, note=f.note + "; no run of the real server drawn after the cost model was frozen is committed yet"
        )
    if not fresh.get("median_abs_error_pct") or not np.isfinite(fresh["median_abs_error_pct"]):
        return f
    return replace(
        f,
        note=f.note + f"; on the held-out runs drawn after the cost model was frozen: "
        f"{fresh['median_abs_error_pct']:.1f} % "
        f"over {fresh['runs']} runs in {_count(len(fresh['per_repeat']), 'repeat')}{_of_models(fresh)}"
        + _drift_clause(fresh.get("drift")),
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _of_models(fresh: dict) -> str:
    """ "; llama-3-8b only, qwen2-0.5b's not measured yet" where the fresh runs so far cover some frozen models."""
    missing = fresh.get("missing_models") or []
    if not missing:
        return ""
    have = ", ".join(model_name(m) for m in fresh.get("models", []))
    waits = ", ".join(f"{model_name(m)}'s" for m in missing)
    return f"; {have} only, {waits} not measured yet"


def _drift_clause(drift) -> str:
    """Where the fresh runs' server differs from the one the freeze was fitted to, say so beside their error."""
    if drift is None or drift.empty or not drift["changed"].fillna(False).any():
        return ""
    moved = drift[drift["changed"].fillna(False)]
    each = ", ".join(
        f"{model_name(r.model)} p50 ITL {r.calibration:.1f} → {r.fresh_real:.1f} ms" for r in moved.itertuples()
    )
    return f" (the server changed since the frozen model's calibration runs: {each}; see the held-out section)"


def f23_finding(page_or_runs) -> Finding:
    """F2.3 as the findings table shows it: from a page (``report``'s) or from this study's runs (computed)."""
    page = page_or_runs if isinstance(page_or_runs, Study8Page) else report(page_or_runs)
    return next((f for f in page.findings if f.id == "F2.3"), f23_not_measured("no validation"))


# ---- the real runs -------------------------------------------------------------------------------------------
def _real_runs(r: Study8Page, s1runs: RunSet) -> sources.Study1 | None:
    s1 = sources.study1_repeat(s1runs, s1runs.repeats[0]) if s1runs.measured else None
    if s1 is None:
        r.notes.append("No Study 1 server runs under this results root: nothing to calibrate or validate on.")
        return None
    r.source = f"Study 1's server runs on the {s1runs.device_name}"  # the device's name, not its folder's slug
    r.study1, r.s1_params, r.s1_slug = True, s1.params, s1.slug
    r.limits = study1_runs.server_limits(s1.params)
    p = s1.params
    r.deadline_s = (p["window_s"] + p["drain_s"]) if {"window_s", "drain_s"} <= set(p) else None
    today = sources.runs_of(sources.STUDY1, s1runs.results_root)
    named = _study1_names(s1runs, today)
    r.s1_repeat = named.repeat_name(s1.repeat)
    r.s1_partial = _partial_repeats(s1runs, today)
    r.s1_every = today if named is today else None
    if today.current and not s1runs.current:
        r.notes.append(
            f"Study 1 at today's fingerprint has no repeat with every part yet ({', '.join(today.parts)} measured): "
            f"the simulator replays Study 1's last whole run ({'the legacy run' if s1.legacy else 'fingerprint '}"
            f"{'' if s1.legacy else s1runs.fingerprint}, commit {s1.commit[:7]})."
        )
    r.tables["_runs"] = (
        s1.requests.groupby(["model", "scheduler", "budget", "rate"], dropna=False)
        .size()
        .rename("requests")
        .reset_index()
    )
    return s1


def _study1_names(whole: RunSet, every: RunSet) -> RunSet:
    """The runs whose repeats name the simulator's: Study 1's page counts every repeat, the simulator takes only
    those with every part (``sources.study1_runs``), and the two name a repeat alike where they read the same runs."""
    return every if every.fingerprint == whole.fingerprint else whole


def _partial_repeats(whole: RunSet, every: RunSet) -> dict[str, list[str]]:
    """Study 1's repeats the simulator leaves out for a missing part, named as Study 1's page names them: the parts
    each lacks."""
    from servelab.studies.s01_scheduling.measure import PARTS

    if _study1_names(whole, every) is not every:
        return {}
    return {
        every.repeat_name(k): [p for p in PARTS if p not in every.repeat(k).parts]
        for k in every.repeats
        if k not in whole.repeats
    }


def _selector_words(selector: str) -> tuple[str, str]:
    """One of Study 1's part selectors as the model it runs and its runs in the seed's names: "llama-3-8b/fcfs/0.7" ->
    ("llama-3-8b", "FCFS runs at rate fraction 0.7"), "llama-3-8b/budget@128" -> ("llama-3-8b", "ChunkedPrefill@128"),
    a budget-sweep setting, "llama-3-8b/eager_cont_batch" -> ("llama-3-8b", "EagerContBatch runs")."""
    from servelab.studies.s01_scheduling.verdicts import SHOWN

    model, what, *rate = selector.split("/")
    name, _, budget = what.partition("@")
    if name == "budget":
        return model, f"{SHOWN['chunked_prefill']}@{budget}"
    policy = SHOWN.get(name, name) + (f"@{budget}" if budget else "")
    return model, f"{policy} runs" + (f" at rate fraction {rate[0]}" if rate else "")


def part_models(part: str) -> set[str]:
    """The models a part of Study 1 runs, as named (``model_name``)."""
    from servelab.studies.s01_scheduling.measure import PART_SELECTORS

    return {model_name(_selector_words(s)[0]) for s in PART_SELECTORS.get(part, [])}


def part_words(parts: list[str]) -> str:
    """Study 1's parts as the runs they hold, in the seed's names and model by model, not by their ids ("llama-budget-
    small"): "llama-3-8b's budget-sweep runs (ChunkedPrefill@128, ChunkedPrefill@256) and its FCFS runs at rate
    fraction 0.7"."""
    from servelab.studies.s01_scheduling.measure import PART_SELECTORS

    by_model: dict[str, list[str]] = {}
    for part in parts:
        sels = PART_SELECTORS.get(part, [])
        if not sels:  # a part this code does not know: its id is all there is to say
            by_model.setdefault("", []).append(part)
            continue
        sweep = [_selector_words(x)[1] for x in sels if x.split("/")[1].startswith("budget@")]
        rest = [_selector_words(x)[1] for x in sels if not x.split("/")[1].startswith("budget@")]
        said = ([f"budget-sweep runs ({', '.join(sweep)})"] if sweep else []) + rest
        by_model.setdefault(model_name(_selector_words(sels[0])[0]), []).append(" and ".join(said))
    out = []
    for model, each in by_model.items():
        out += each if not model else [f"{model}'s {each[0]}" + "".join(f" and its {w}" for w in each[1:])]
    return "; ".join(out)


def lacks_words(partial: dict[str, list[str]]) -> str:
    """Study 1's repeats left out and what each lacks: "repeat 3 of 3 lacks llama-3-8b's budget-sweep runs (...)"."""
    return "; ".join(f"{name} lacks {part_words(parts)}" for name, parts in partial.items())


def _others_only(r: Study8Page) -> bool:
    """Whether every part Study 1's left-out repeats lack runs models F2.3 does not read: they are left out only
    because the simulator takes Study 1's repeats whole (``sources.study1_runs``), not for anything F2.3 reads."""
    lacking = {m for parts in r.s1_partial.values() for p in parts for m in part_models(p)}
    return bool(r.s1_partial) and bool(r.f23_models) and bool(lacking) and not lacking & set(r.f23_models)


def _why_whole(r: Study8Page) -> str:
    """Why a repeat that lacks only other models' parts is left out of F2.3, in sentences: what the fit and the replay
    pool (nothing across models), that the whole-repeat convention alone leaves it out, and that repeat's own reading,
    kept out of the verdict; "" where a lacking part is one F2.3 reads."""
    if not _others_only(r):
        return ""
    models = ", ".join(r.f23_models)
    read = "".join(
        f" Read on its own, {name}'s {models} runs give {value:.1f} % ({verdict}); that reading is not part of the "
        "verdict."
        for name, (value, verdict) in r.s1_readings.items()
    )
    return (
        f"F2.3 reads {models}'s runs alone, and nothing in the fit or the replay pools the models: each model's "
        "serving terms are fitted on its own calibration runs (`validation.validation_table`) and each run is "
        "replayed on its own model's costs. The repeat is left out only because the simulator takes Study 1's "
        "repeats whole, every part or none (`sources.study1_runs`, frozen with the cost model); the GPU jobs still "
        "pending measure those runs and complete it (make gpu-plan lists the jobs)." + read
    )


def _repeats_note(r: Study8Page, whole: RunSet, named: RunSet) -> str:
    """Which of Study 1's repeats the simulator reads, where it has several, and why F2.3 rests on fewer than Study
    1's page counts while a repeat lacks a part; "" where Study 1 has one repeat."""
    n = len(whole.repeats)
    uses = f"the simulator calibrates on and checks against {r.s1_repeat}, and judges F2.3 on " + (
        f"each of {named.repeats_name(whole.repeats)}" if n > 1 else "that repeat alone"
    )
    if not r.s1_partial:
        return f"Study 1 has {n} repeats, each with every part: {uses}." if n > 1 else ""
    short = (
        f"; F2.3's rule needs {MIN_REPEATS} repeats, so it reads inconclusive until those runs are measured"
        if n < MIN_REPEATS
        else ""
    )
    why = _why_whole(r)
    lacks = lacks_words(r.s1_partial)
    return f"Study 1 has {len(named.repeats)} repeats, {n} of them with every part ({lacks}): {uses}{short}." + (
        f" {why}" if why else ""
    )


def _gpu_models(r: Study8Page, models, steps2, fits, *, context_reads: bool = True, notes: bool = True) -> dict:
    gpu = {}
    for m in models:
        found = sources.gpu_cost_model(m, r.P["cost_modes"], steps2, fits, context_reads=context_reads)
        gpu[m] = found[0] if found else None
        if notes:
            r.gpu_notes.append(
                f"{model_name(m)}: Study 2 cost model, mode {found[1]} (fitted from Study 2's steps)"
                if found
                else f"{model_name(m)}: no Study 2 cost model: the whole cost model is fitted to the calibration runs' "
                "step log"
            )
    return gpu


def _validation_of(r: Study8Page, s1: sources.Study1, gpu: dict):
    """``validation.validation_table`` on one repeat of Study 1: (table, calibration, fitted cost models)."""
    p = s1.params
    return validation.validation_table(
        s1.requests,
        s1.steps,
        gpu,
        sim_kwargs=study1_runs.sim_kwargs_for(study1_runs.server_limits(p)),
        every=r.P["calibration_every"],
        outputs_for=study1_runs.requested_outputs_for(p),
        deadline_s=(p["window_s"] + p["drain_s"]) if {"window_s", "drain_s"} <= set(p) else None,
    )


def _validate(r: Study8Page, s1runs: RunSet, s1: sources.Study1, gpu: dict) -> None:
    """The page's validation (Study 1's first repeat), and F2.3 judged on every repeat of Study 1 by today's rule,
    combined over them (``RunSet.combined``: inconclusive below three repeats or where they disagree)."""
    table, calib, r.fitted = _validation_of(r, s1, gpu)
    r.tables.update(sim_validation=table, sim_calibration=calib, sim_error_summary=validation.error_summary(table))
    r.f23_models = [model_name(m) for m in study2_models(r)]

    def repeat_findings(rep: RunSet) -> list[Finding]:
        index = rep.repeats[0]
        if index == s1.repeat:
            t = table  # the page's own validation: computed once
        else:
            other = sources.study1_repeat(s1runs, index)
            if other is None:
                return []
            t = _validation_of(r, other, gpu)[0]
        f = verdicts.f23_finding(t, r.source)
        return [f] if f is not None else []

    found = [f for f in s1runs.combined(repeat_findings) if f.id == "F2.3"]
    r.s1_readings = _partial_readings(r, gpu)
    if found:
        f = _with_fresh(_named_as_study1(found[0], s1runs, r.s1_every), r.fresh)
        r.f23 = replace(f, note=f23_lead(f, r) + " " + f.note)
        r.tables["f23_evidence"] = pd.DataFrame([r.f23.row()])


def _named_as_study1(f: Finding, whole: RunSet, every: RunSet | None) -> Finding:
    """F2.3's note with its repeat named as Study 1's page names it: the combined note names the quoted repeat among
    the whole repeats alone ("[from repeat 1 of 2"), the page and Study 1 among all of them ("repeat 1 of 3")."""
    if every is None or every.repeats == whole.repeats:
        return f
    note = f.note
    for k in whole.repeats:
        note = note.replace(f"[from {whole.repeat_name(k)}", f"[from {every.repeat_name(k)}")
    return replace(f, note=note)


def _partial_readings(r: Study8Page, gpu: dict) -> dict[str, tuple[float, str]]:
    """Each of Study 1's repeats left out for other models' parts only (``_others_only``), read by F2.3's rule on the
    runs of F2.3's models alone: name → (median |error| with the serving overheads, verdict). Shown beside the
    verdict, never in it: the verdict takes Study 1's repeats whole. Each model is fitted and replayed on its own
    runs, so these are the numbers that repeat would give once whole."""
    every = r.s1_every
    if every is None or not _others_only(r):
        return {}
    out = {}
    for k in every.repeats:
        name = every.repeat_name(k)
        if name not in r.s1_partial:
            continue
        one = sources.study1_repeat(every, k)
        if one is None:
            continue
        mine = one.requests["model"].map(model_name).isin(r.f23_models)
        steps = one.steps[one.steps["model"].map(model_name).isin(r.f23_models)]
        one = replace(one, requests=one.requests[mine], steps=steps)
        costs = {m: c for m, c in gpu.items() if model_name(m) in r.f23_models}
        f = verdicts.f23_finding(_validation_of(r, one, costs)[0], r.source) if mine.any() else None
        if f is not None and f.headline is not None:
            out[name] = (float(f.headline), f.verdict)
    return out


def f23_span(f: Finding) -> str:
    """F2.3's interval over its repeats ("19.7–34.8"), "" for one repeat: to the page's one decimal, as every other
    error on the page."""
    if f.repeats <= 1 or "–" not in f.spread:
        return ""
    lo, hi = (float(x) for x in f.spread.split("–"))
    return f"{lo:.1f}–{hi:.1f}"


def f23_value(f: Finding) -> str:
    """F2.3's value (the median over its repeats) to the page's one decimal, "27.3"; its own text where not a
    number."""
    try:
        return f"{float(f.measured_value):.1f}"
    except ValueError:
        return format_value(f.measured_value)


def f23_error_words(f: Finding) -> str:
    """F2.3's error as the reader compares it with the goal: the interval over its repeats, or one repeat's value."""
    span = f23_span(f)
    return f"{span} % over {f.repeats} repeats" if span else f"{f23_value(f)} %"


def f23_lead(f: Finding, r) -> str:
    """F2.3's note opens with its substance, in one sentence (the landing table shows only a note's first): the
    simulator's held-out error against the goal, and, where it rests on fewer repeats than a verdict needs because
    Study 1's other repeats lack parts, why; then whether F2.3 reads those parts at all (``_why_whole``)."""
    said = f"The simulator's held-out median |error| is {f23_error_words(f)} (goal ≤ {GOAL_PCT:g} %)"
    partial = r.s1_partial
    if f.verdict != "inconclusive" or f.repeats >= MIN_REPEATS or not partial:
        return said + "."
    n = sum(len(parts) for parts in partial.values())
    names = " and ".join(partial)
    if _others_only(r):
        models = ", ".join(sorted({m for parts in partial.values() for p in parts for m in part_models(p)}))
        first = (
            f"{said}, inconclusive because Study 1's {names} lacks {n} parts, all of them {models} runs, which F2.3 "
            "does not read."
        )
        those = (
            f"They are {part_words(next(iter(partial.values())))}."
            if len(partial) == 1
            else f"{lacks_words(partial)[:1].upper()}{lacks_words(partial)[1:]}."
        )
        return f"{first} {those} {_why_whole(r)}"
    lacking = " and ".join(f"{name} lacks {len(parts)} of its parts" for name, parts in partial.items())
    return (
        f"{said}, inconclusive as Study 1's {lacking}. The simulator calibrates on and checks against whole repeats "
        f"of Study 1 (every part), so F2.3 rests on {f.repeats} repeats where a verdict needs {MIN_REPEATS}: "
        f"{lacks_words(partial)}, and F2.3 is judged on {MIN_REPEATS} repeats once those are measured (make gpu-plan "
        "lists the jobs)."
    )


def _ablate(r: Study8Page, s1: sources.Study1, steps2, fits) -> None:
    models = sorted(s1.requests["model"].unique())
    gpu_for = {reads: _gpu_models(r, models, steps2, fits, context_reads=reads, notes=False) for reads in (0, 1)}
    terms, r.fitted_by_terms = ablation.term_ablation(
        s1.requests,
        s1.steps,
        r.limits,
        lambda reads: gpu_for[int(reads)],
        every=r.P["calibration_every"],
        outputs_for=study1_runs.requested_outputs_for(r.s1_params),
        deadline_s=r.deadline_s,
        known={"both": (r["sim_validation"], r["sim_calibration"], r.fitted)},  # the page's own validation
    )
    r.tables["sim_term_ablation"] = terms


def _context_check(r: Study8Page, s1: sources.Study1, gpu: dict, steps2, fits) -> None:
    model = next((m for m in sorted(r.fitted) if gpu.get(m) is not None), None)
    if model is None:
        r.notes.append("No model with Study 2 costs was calibrated here: no context-read figure.")
        return
    runs = [x for x in validation.run_groups(s1.requests, s1.steps) if x[0]["model"] == model]
    feats = validation.runs_features(runs, study1_runs.sim_kwargs_for(r.limits))
    cost = r.fitted[model]["gpu+overheads"]
    excess = context_reads.mixed_step_excess(cost, feats) if len(feats) else pd.DataFrame()
    found = sources.gpu_cost_model(model, r.P["cost_modes"], steps2, fits, context_reads=False)
    decode = context_reads.decode_walk_check(found[0], steps2, model, found[1]) if found else pd.DataFrame()
    r.context = dict(model=model, cost=cost, excess=excess, decode=decode)


def _study7_check(r: Study8Page, root) -> None:
    study7 = study7_runs.study7(root)
    if study7 is None:
        r.notes.append("No completed Study 7 server runs under this results root: no prefix-cache check.")
        return
    s7_cost = r.fitted.get(study7.params.get("model"))
    if s7_cost is None:
        r.notes.append(f"Study 7's model {study7.params.get('model')} has no calibrated cost model here: no check.")
        return
    r.study7, r.s7_cost, params = study7, s7_cost, study7.params
    r.s7_repeat = sources.runs_of(sources.STUDY7, root).repeat_name(study7.repeat)
    without = r.fitted_by_terms.get("neither", {}).get(params["model"], {}).get("gpu+overheads")
    costs = {"with both": s7_cost["gpu+overheads"]}
    if without is not None:
        costs = {"without the two terms": without, **costs}
    r.tables["sim_prefill_check"] = study7_runs.prefill_check(study7.prefix_length, params, costs)
    table, r.s7_runs = study7_runs.replay_serving(study7.summary, params, s7_cost)
    r.tables["sim_prefix_validation"] = table
    r.tables["sim_prefix_speedups"] = study7_runs.caching_speedups(table)
    # the step-cost sensitivity of the runs the page explains (missed by more than MISS_PCT): each step 10 % cheaper,
    # as priced, 10 % dearer
    g = table[table["cost_model"] == "gpu+overheads"].assign(abs_err=lambda d: d["error_pct"].abs())
    per_run = g.groupby(["load", "caching"], sort=False)["abs_err"].median()
    missed = [key for key, err in per_run.items() if err > MISS_PCT]
    r.tables["sim_prefix_sensitivity"] = (
        pd.concat(
            [
                study7_runs.step_cost_sensitivity(params, s7_cost["gpu+overheads"], load, caching, SENSITIVITY)
                for load, caching in missed
            ],
            ignore_index=True,
        )
        if missed
        else pd.DataFrame()
    )
    if study7.requests is not None:
        r.tables["sim_prefix_first_tokens"] = study7_runs.first_tokens(study7.requests, r.s7_runs["gpu+overheads"])


# ---- the fresh held-out run ----------------------------------------------------------------------------------
def fresh_error(runs: RunSet) -> dict:
    """The fresh held-out runs (the measuring path's ``fresh_*`` parts, one seed per repeat) replayed on the frozen
    cost models, no refit: ``{"table", "median_abs_error_pct", "per_repeat", "runs", "code_matches",
    "frozen_code", "measured_code"}``; {} where no fresh run was measured. The error is the median over repeats of
    each repeat's median |error| (``per_repeat``: seed → error), as the ledger's ``reported`` rows record it
    (``heldout report``). It counts only where the cost-model code at every run matched the freeze
    (``code_matches``; the page says so otherwise)."""
    reps = heldout.campaign_repeats(runs)
    if not reps:
        return {}
    try:
        rec = freeze_record.load_freeze()
        models = freeze_record.frozen_models(rec)
    except Exception as e:  # noqa: BLE001 - no freeze here: say so
        return {"error": f"no frozen cost model ({e})"}
    tables, checks, commits = [], [], []
    for c in reps:
        req = c["requests"][c["requests"]["model"].isin(models)]
        if req.empty:
            continue
        tables.append(heldout.evaluate(req, c["params"], models).assign(repeat=c["repeat"], seed=c["seed"]))
        checks += c["checks"]
        commits.append(c["commit"])
    if not tables:
        return {}
    table = pd.concat(tables, ignore_index=True)
    per = table.groupby("seed", sort=True)["error_pct"].apply(lambda e: float(e.abs().median()))
    frozen = rec["code"]["sha256"]
    measured = sorted({c.get("code_sha256", "") for c in checks})
    return {
        "table": table,
        "median_abs_error_pct": float(per.median()),
        "per_repeat": {int(k): v for k, v in per.items()},
        "runs": len(table.drop_duplicates(subset=["repeat", *validation.RUN_KEYS])),
        # which frozen models the fresh runs replayed so far: a part not yet measured leaves its model out
        "models": sorted(table["model"].unique()),
        "missing_models": sorted(set(models) - set(table["model"])),
        "code_matches": measured == [frozen],
        "frozen_code": frozen,
        "measured_code": measured,
        "frozen_utc": rec.get("frozen_utc", ""),
        # the server the frozen terms were fitted to against the fresh runs' (its decode first)
        "drift": (drift := fresh_drift.drift(table, rec)),
        "drift_text": fresh_drift.text(drift, (rec.get("calibration") or {}).get("study1_commit", ""), commits),
    }


def registered_seeds(root=freeze_record.VALIDATION_DIR) -> dict[str, list[int]]:
    """The seeds ``data/validation/ledger.csv`` registered under the current freeze, by fresh run (its
    ``registered`` rows; a freeze again voids the registrations made before it)."""
    root = Path(root)
    book = ledger_mod.read(root / freeze_record.LEDGER_FILE)
    freeze_file = root / freeze_record.FREEZE_FILE
    current = ledger_mod.file_sha256(freeze_file) if freeze_file.is_file() else None
    reg = book[(book["event"] == "registered") & (book["freeze_sha256"] == current)]
    out: dict[str, list[int]] = {}
    for run_id, seed in zip(reg["run_id"], reg["seed"], strict=True):
        if str(seed).strip().lstrip("-").isdigit():
            out.setdefault(run_id, []).append(int(seed))
    return out


def fresh_seeds(runs: RunSet, root=freeze_record.VALIDATION_DIR) -> pd.DataFrame:
    """One row per measured fresh run (part, repeat): the ledger's spec and the seed it ran with (its
    ``fresh_seed.json``, else its ``fresh_params.json``), and whether the ledger registered that seed for that spec.
    Where no fresh run was measured: the seeds a campaign's first three repeats would use (spec seed + repeat)."""
    reg = registered_seeds(root)
    rows = []
    for run in runs.runs if runs.measured else ():
        if not run.part.startswith(FRESH) and run.part != "all":
            continue
        rec = run.json("fresh_seed") or {}
        params = run.json("fresh_params") or {}
        run_id, seed = rec.get("fresh_run", params.get("fresh_run")), rec.get("seed", params.get("seed"))
        if run_id is None or seed is None:
            continue
        rows.append({"part": run.part, "repeat": run.repeat, "fresh_run": run_id, "seed": int(seed), "measured": True})
    if not rows:
        run_id = params_mod.DEFAULTS["full"]["fresh_run"]
        try:
            base = int(heldout.load_spec(run_id, root)["seed"])
        except ParameterError:  # no spec: nothing to say about seeds
            return pd.DataFrame()
        rows = [{"part": "", "repeat": k, "fresh_run": run_id, "seed": base + k, "measured": False} for k in range(3)]
    t = pd.DataFrame(rows)
    t["registered"] = [s in reg.get(f, []) for f, s in zip(t["fresh_run"], t["seed"], strict=True)]
    return t


# ---- beyond one GPU ------------------------------------------------------------------------------------------
def _capacity_cost(r: Study8Page):
    P = r.P
    cost = r.fitted.get(P["capacity_model"], {}).get("gpu+overheads")
    if cost is None and r.fitted:
        cost = next(iter(r.fitted.values()))["gpu+overheads"]
        r.notes.append(f"{P['capacity_model']} was not replayed; using {next(iter(r.fitted))}'s cost model.")
    return cost


def _capacity_trace(P: dict, lengths, rate: float):
    duration = min(P["capacity_duration_s"], P["capacity_max_requests"] / rate)  # bounds the simulation's cost
    t = Trace.synthetic(rate=rate, lengths=lengths, duration_s=duration, seed=P["seed"], max_requests=2_000_000)
    return with_shared_prefixes(t, groups=P["prefix_groups"], prefix_tokens=P["prefix_tokens"], seed=P["seed"])


def _rate_trace(P: dict, lengths, one: float, rate: float):
    """The trace of ``rate`` for the replicas-needed search: it spans the time one replica's does, its requests
    growing with the rate. A fixed request count gave 8× the rate an eighth of the time, too short for queues to
    build, and the search then found fewer replicas than linear scaling (4 for 8× one replica's rate)."""
    return _capacity_trace(
        {**P, "capacity_max_requests": P["capacity_max_requests"] * max(1.0, rate / one)}, lengths, rate
    )


def _capacity(r: Study8Page) -> None:
    from servelab.studies.s01_scheduling.sweep import workload_lengths

    P = r.P
    cost = _capacity_cost(r)
    if cost is None or "prompt_scale" not in r.s1_params:
        return
    lengths = workload_lengths(r.s1_params)
    slo = capacity.default_slo(cost, *lengths.means())
    slo = (P["slo_ttft_ms"] or slo[0], P["slo_tpot_ms"] or slo[1])
    sched = study1_runs.sim_kwargs_for(r.limits)({"scheduler": "chunked_prefill", "budget": None})
    make_trace = functools.partial(_capacity_trace, P, lengths)
    kw = dict(cost=cost, slo_ttft_ms=slo[0], slo_tpot_ms=slo[1], **sched)
    one = capacity.single_replica_rate(make_trace, refine=P["rate_search_refine"], **kw)
    if not np.isfinite(one):
        r.notes.append("One replica misses the SLO even at 1 req/s; the capacity rates are multiples of 1 req/s.")
        one = 1.0
    needed, tried = capacity.replicas_needed(
        functools.partial(_rate_trace, P, lengths, one),
        [one * m for m in P["capacity_rate_multiples"]],
        P["capacity_routers"],
        max_replicas=P["max_replicas"],
        time_budget_s=None,
        progress=False,
        **kw,
    )
    r.tables["capacity_needed"] = needed.assign(single_replica_rate=one)
    r.tables["capacity_tried"] = tried.drop(columns=[c for c in tried.columns if "wall" in c])
    # the other way round, as a cluster run on N GPUs will measure it: the rate N replicas sustain (Beyond one GPU)
    # each N gets the same requests per replica, so that no N is judged on a shorter burst than another
    per_n = {**P, "capacity_duration_s": math.inf}

    def trace_for(rate: float, n: int):
        return _capacity_trace({**per_n, "capacity_max_requests": P["replica_requests"] * n}, lengths, rate)

    table, tried_n = replica_capacity.replica_capacity(
        trace_for, P["capacity_routers"], one=one, refine=P["replica_refine"], **kw
    )
    r.tables["replica_capacity"], r.tables["replica_capacity_tried"] = table, tried_n
    r.cap = dict(cost=cost, lengths=lengths, slo=slo, one=one, sched=sched)


def _affinity(r: Study8Page) -> None:
    if not r.cap:
        return
    P, cost = r.P, r.cap["cost"]
    trace = functools.partial(
        prefix_routing.affinity_trace,
        requests=P["affinity_requests"],
        prefixes=P["affinity_prefixes"],
        prefix_tokens=P["affinity_prefix_tokens"],
        suffix_tokens=P["affinity_suffix_tokens"],
        output_tokens=P["affinity_output_tokens"],
        seed=P["seed"],
    )
    sched = {k: v for k, v in r.cap["sched"].items() if k != "num_blocks"}
    pools = [
        prefix_routing.pool_for_fraction(
            f,
            prefixes=P["affinity_prefixes"],
            prefix_tokens=P["affinity_prefix_tokens"],
            private_tokens=P["affinity_suffix_tokens"] + P["affinity_output_tokens"],
            block_size=sched["block_size"],
            max_num_seqs=sched["max_num_seqs"],
        )
        for f in P["affinity_pool_fractions"]
    ]
    prompt = P["affinity_prefix_tokens"] + P["affinity_suffix_tokens"]
    slo = capacity.default_slo(cost, prompt, P["affinity_output_tokens"])
    search = dict(cost=cost, slo_ttft_ms=slo[0], slo_tpot_ms=slo[1], prefix_caching=True, num_blocks=max(pools))
    search.update(refine=P["rate_search_refine"], **sched)
    # doubling from the rate one replica sustains on Study 1's lengths (fewer simulations); from 1 req/s where
    # even that rate misses the SLO on this workload
    one = capacity.single_replica_rate(trace, start=r.cap["one"], **search)
    if not np.isfinite(one) and r.cap["one"] > 1:
        one = capacity.single_replica_rate(trace, **search)
    one = one if np.isfinite(one) else 1.0
    table = prefix_routing.compare_routers(
        trace,
        [one * m for m in P["affinity_rate_multiples"]],
        cost=cost,
        replicas=P["affinity_replicas"],
        pools=pools,
        routers=P["capacity_routers"],
        prefixes=P["affinity_prefixes"],
        progress=False,
        **sched,
    )
    table = table.drop(columns=[c for c in table.columns if "wall" in c])
    r.tables["affinity_routing"] = table.assign(single_replica_rate=one)
    r.tables["affinity_gain"] = prefix_routing.affinity_gain(table)
    r.aff = dict(slo=slo, pools=pools, one=one)


def _speed(r: Study8Page) -> None:
    """The simulator's speed as the measuring run timed it on its host (never timed at render)."""
    s = r.runs.table("sim_speed") if r.runs.measured else pd.DataFrame()
    if s.empty:
        r.notes.append("The simulator's speed was not measured (the measuring path's `speed` part).")
        return
    row = s.iloc[0].to_dict()
    for k in ("part", "repeat"):
        row.pop(k, None)
    if len(s) > 1:
        row["hour_wall_s"] = float(s["hour_wall_s"].median())
        row["repeats"] = len(s)
    r.speed = row
    r.tables["sim_speed"] = s


# ---- the report ----------------------------------------------------------------------------------------------
def report(runs: RunSet) -> Study8Page:
    """The page's record from this study's runs and, under the same results root, Studies 1, 2 and 7's runs."""
    if not runs.measured:
        return Study8Page(runs, [f23_not_measured("no run of the simulator's study on the book's device")])
    root = runs.results_root
    r = Study8Page(runs, [])
    r.fresh = fresh_error(runs)
    r.tables["fresh_seeds"] = fresh_seeds(runs)
    _speed(r)
    s1runs = sources.study1_runs(root)
    s1 = _real_runs(r, s1runs)
    if s1 is not None:
        steps2 = sources.study2_steps(root)
        fits = sources.fitted_gpu_models(steps2)
        models = sorted(s1.requests["model"].unique())
        gpu = _gpu_models(r, models, steps2, fits)
        _validate(r, s1runs, s1, gpu)
        # after the validation: the note says which models F2.3 reads, and what a left-out repeat of them says
        said = _repeats_note(r, s1runs, _study1_names(s1runs, s1runs if r.s1_every is None else r.s1_every))
        if said:
            r.notes.insert(0, said)
        _ablate(r, s1, steps2, fits)
        _context_check(r, s1, gpu, steps2, fits)
        _study7_check(r, root)
        _capacity(r)
        _affinity(r)
    r.findings = [r.f23 or f23_not_measured("no model with Study 2 costs was replayed against Study 1's runs")]
    return r


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The simulator's error beside Vidur's (under 9 %): the fresh held-out run's median |error| where it was
    measured, else F2.3's value on Study 1's held-out runs (used during development: the note says so)."""
    return _published_from(report(runs)) if runs.measured else None


def _published_from(r: Study8Page) -> tuple[str, str] | None:
    f = r.fresh
    if f.get("median_abs_error_pct") is not None and f.get("code_matches"):
        return (
            f"{f['median_abs_error_pct']:.1f} %",
            "median |error| of six serving metrics on held-out runs of the real server drawn after the cost model was "
            f"frozen ({f['runs']} runs, {_count(len(f['per_repeat']), 'repeat')}{_of_models(f)})",
        )
    f23 = r.f23
    if f23 is None or f23.headline is None:
        return None
    # F2.3's own value and interval, as the findings table gives them: one repeat's error here read as another number
    over = f"F2.3's value, the median over {f23.repeats} repeats ({f23_span(f23)} %) of the " if f23_span(f23) else ""
    models = ", ".join(map(model_name, study2_models(r)))
    return (
        f"{f23_value(f23)} %",
        f"{over}median |error| of six serving metrics on Study 1's runs held out from the fit, for {models}, whose GPU "
        "costs are Study 2's; reported on while the model was developed: no held-out run drawn after the cost model "
        "was frozen is measured yet",
    )


def study2_models(r: Study8Page) -> list[str]:
    """The replayed models whose GPU costs are Study 2's (F2.3's), not fitted to Study 1's step log."""
    t = r["sim_validation"]
    if t.empty or "gpu_source" not in t.columns:
        return []
    return sorted(t.loc[t["gpu_source"] == "Study 2", "model"].unique())


def published(r: Study8Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, _published_from(r) if r.runs.measured else None, r.device)
