"""The simulator page: one run of every part (``run``), then one call per section of the notebook.

``run`` loads Study 1's runs (or makes CPU stand-ins), validates the simulator on them, ablates its GPU terms,
checks it against Study 7's server, searches the capacity, compares the routers over prefix caches and times the
simulator, writing every table (``StudyResults``). The section functions show the tables and figures; the
sentences come from ``takeaways``, every number from the run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from servelab.loadgen.workload import Trace
from servelab.measure import device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.sim import capacity
from servelab.sim.prefix_workload import with_shared_prefixes
from servelab.studies.common.findings import Finding
from servelab.studies.common.page import rerun_recipe, show, verdict_table
from servelab.studies.common.style import use_book_style
from servelab.studies.s08_simulator import (
    ablation,
    context_reads,
    heldout,
    plots,
    prefix_routing,
    speed,
    study1_runs,
    study7_runs,
    takeaways,
    validation,
    verdicts,
)
from servelab_book.published import render_published

SLUG = "08_simulator"


@dataclass
class Run:
    """Everything the page shows, from one run; ``tables`` holds every table written, by its file name."""

    P: dict
    dev: object  # servelab.measure.device.DeviceRecord
    source: str  # where the real runs come from
    study1: bool  # True: Study 1's server runs; False: CPU stand-ins
    s1_params: dict
    limits: dict
    deadline_s: float | None
    gpu_notes: list[str]
    s1_slug: str | None = None  # the device slug of Study 1's runs (None: stand-ins)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)  # model → {"gpu_only", "gpu+overheads"} cost models
    fitted_by_terms: dict = field(default_factory=dict)  # ablation variant → model → fitted cost models
    f23: Finding | None = None
    notes: list[str] = field(default_factory=list)  # what a part could not do here, and why
    study7: object = None  # study7_runs.Study7Runs, when its runs could be replayed
    s7_cost: dict | None = None
    s7_runs: dict | None = None
    context: dict = field(default_factory=dict)  # the context-read check: model, cost, excess, decode
    cap: dict = field(default_factory=dict)  # the capacity part: cost model, SLO, lengths, one replica's rate
    aff: dict = field(default_factory=dict)  # the affinity part: SLO, pools, one replica's rate
    speed: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def table(self, name: str) -> pd.DataFrame | None:
        return self.tables.get(name)


# ---- the real runs -----------------------------------------------------------------------------------------
def _real_runs(P: dict, dev) -> Run:
    """Study 1's server runs under the results root, or the engine driven in-process on the CPU (CI)."""
    study1 = study1_runs.load_study1()
    notes = []
    if study1 is not None:
        requests, steps, s1_params, slug = study1
        source = f"Study 1's server runs on {slug}"
    else:
        notes.append(
            "No Study 1 results under this results root (CI, or notebook 01 has not run here): the 'real' runs are "
            "the engine itself, driven in-process on the CPU by Poisson traces (config:tiny-llama, wall clock)."
        )
        requests, steps, s1_params = study1_runs.stand_in_runs(
            P["smoke_rates"], P["smoke_requests"], seed=P["seed"], progress=False
        )
        source, slug = "the engine in-process on the CPU (stand-in for the server)", None
    deadline = (s1_params["window_s"] + s1_params["drain_s"]) if {"window_s", "drain_s"} <= set(s1_params) else None
    r = Run(
        P=P,
        dev=dev,
        source=source,
        study1=study1 is not None,
        s1_params=s1_params,
        limits=study1_runs.server_limits(s1_params),
        deadline_s=deadline,
        gpu_notes=[],
        s1_slug=slug,
        notes=notes,
    )
    r.tables["_requests"], r.tables["_steps"] = requests, steps
    r.tables["_runs"] = (
        requests.groupby(["model", "scheduler", "budget", "rate"], dropna=False).size().rename("requests").reset_index()
    )
    return r


def _gpu_models(r: Run) -> dict:
    """Study 2's cost model of each replayed model, or None where the step log must stand in."""
    gpu = {}
    for m in sorted(r["_requests"]["model"].unique()):
        found = study1_runs.gpu_cost_model(m, r.P["cost_modes"])
        gpu[m] = found[0] if found else None
        r.gpu_notes.append(
            f"{m}: Study 2 cost model, mode {found[1]}"
            if found
            else f"{m}: no Study 2 cost model: the whole cost model is fitted to the calibration runs' step log"
        )
    return gpu


def _validate(r: Run, res: StudyResults, gpu: dict) -> None:
    """Real against simulated, with Study 2's GPU costs alone and with the fitted serving overheads."""
    table, calib, r.fitted = validation.validation_table(
        r["_requests"],
        r["_steps"],
        gpu,
        sim_kwargs=study1_runs.sim_kwargs_for(r.limits),
        every=r.P["calibration_every"],
        outputs_for=study1_runs.requested_outputs_for(r.s1_params),
        deadline_s=r.deadline_s,
    )
    r.tables.update(sim_validation=table, sim_calibration=calib, sim_error_summary=validation.error_summary(table))
    if r.study1 and r.s1_slug == r.dev.slug:  # the table also lives beside the runs it validates
        first = ["scheduler", "rate", "metric", "real", "sim", "error_pct"]
        res.write_for("01_scheduling", "sim_validation", table[first + [c for c in table.columns if c not in first]])
    for m, models in r.fitted.items():  # the calibrated cost model, for `python -m servelab.sim --cost-model`
        res.write_json("sim_cost_model_" + m.replace(":", "_").replace("/", "_"), models["gpu+overheads"].as_dict())
    r.f23 = verdicts.f23_finding(table, r.source)
    if r.f23 is not None:
        r.tables["f23_evidence"] = pd.DataFrame([r.f23.row()])


def _ablate(r: Run) -> None:
    """The validation again with the padding and the context reads each left out."""
    terms, r.fitted_by_terms = ablation.term_ablation(
        r["_requests"],
        r["_steps"],
        r.limits,
        r.P["cost_modes"],
        every=r.P["calibration_every"],
        outputs_for=study1_runs.requested_outputs_for(r.s1_params),
        deadline_s=r.deadline_s,
    )
    r.tables["sim_term_ablation"] = terms


def _context_check(r: Run, gpu: dict) -> None:
    """Where the context reads show: Study 1's mixed steps and Study 2's decode steps against the model."""
    model = next((m for m in sorted(r.fitted) if gpu.get(m) is not None), None)
    if model is None:
        r.notes.append("No model with Study 2 costs was calibrated here: no context-read figure.")
        return
    # every run's steps, held-out ones included: the walk's rate comes from Study 2, not from these
    runs = [x for x in validation.run_groups(r["_requests"], r["_steps"]) if x[0]["model"] == model]
    feats = validation.runs_features(runs, study1_runs.sim_kwargs_for(r.limits))
    cost = r.fitted[model]["gpu+overheads"]
    excess = context_reads.mixed_step_excess(cost, feats) if len(feats) else pd.DataFrame()
    s2 = study1_runs.study2_steps()
    found = study1_runs.gpu_cost_model(model, r.P["cost_modes"], context_reads=False)
    decode = (
        context_reads.decode_walk_check(found[0], s2, model, found[1]) if s2 is not None and found else pd.DataFrame()
    )
    r.context = dict(model=model, cost=cost, excess=excess, decode=decode)


def _study7_check(r: Run, res: StudyResults) -> None:
    """Study 7's server runs replayed with the simulator's prefix cache, on the cost model calibrated above."""
    study7 = study7_runs.load_study7()
    if study7 is None:
        r.notes.append(
            "No completed Study 7 server runs under this results root (CI, or notebook 07 has not run here): "
            "no prefix-cache check."
        )
        return
    s7_cost = r.fitted.get(study7.params["model"])
    if s7_cost is None:
        r.notes.append(f"Study 7's model {study7.params['model']} has no calibrated cost model here: no check.")
        return
    r.study7, r.s7_cost, params = study7, s7_cost, study7.params
    # first the steps themselves, priced with and without the two GPU terms (both calibrated on Study 1 alone)
    without = r.fitted_by_terms.get("neither", {}).get(params["model"], {}).get("gpu+overheads")
    costs = {"with both": s7_cost["gpu+overheads"]}
    if without is not None:
        costs = {"without the two terms": without, **costs}
    r.tables["sim_prefill_check"] = study7_runs.prefill_check(study7.prefix_length, params, costs)
    table, r.s7_runs = study7_runs.replay_serving(study7.summary, params, s7_cost)
    r.tables["sim_prefix_validation"] = table
    r.tables["sim_prefix_speedups"] = study7_runs.caching_speedups(table)
    g = table[table["cost_model"] == "gpu+overheads"]
    r.tables["sim_prefix_sensitivity"] = pd.concat(
        [
            study7_runs.step_cost_sensitivity(params, s7_cost["gpu+overheads"], load, caching, [0.9, 1.0, 1.1, 1.2])
            for load, caching in g.groupby(["load", "caching"], sort=False).size().index
        ],
        ignore_index=True,
    )
    if study7.requests is not None:
        r.tables["sim_prefix_first_tokens"] = study7_runs.first_tokens(study7.requests, r.s7_runs["gpu+overheads"])


# ---- beyond one GPU ----------------------------------------------------------------------------------------
def _capacity_cost(r: Run):
    """The capacity model's calibrated cost model, else another calibrated one, else Study 2's without overheads."""
    P = r.P
    cost = r.fitted.get(P["capacity_model"], {}).get("gpu+overheads")
    if cost is None and r.fitted:
        cost = next(iter(r.fitted.values()))["gpu+overheads"]
        r.notes.append(
            f"{P['capacity_model']} was not among the replayed runs; using {next(iter(r.fitted))}'s cost model."
        )
    if cost is None:
        cost = study1_runs.gpu_cost_model(P["capacity_model"], P["cost_modes"])[0]
        r.notes.append(f"No calibrated cost model; Study 2's {cost.source} without serving overheads.")
    return cost


def _lengths(r: Run):
    if r.study1 and "prompt_scale" in r.s1_params:
        from servelab.studies.s01_scheduling.sweep import workload_lengths

        return workload_lengths(r.s1_params)
    return study1_runs.stand_in_lengths()


def _capacity_trace(P: dict, lengths, rate: float):
    duration = min(P["capacity_duration_s"], P["capacity_max_requests"] / rate)  # bounds the simulation's cost
    t = Trace.synthetic(rate=rate, lengths=lengths, duration_s=duration, seed=P["seed"], max_requests=2_000_000)
    return with_shared_prefixes(t, groups=P["prefix_groups"], prefix_tokens=P["prefix_tokens"], seed=P["seed"])


def _capacity(r: Run) -> None:
    """The fewest replicas behind each router that meet the SLO, at multiples of one replica's rate."""
    P = r.P
    cost, lengths = _capacity_cost(r), _lengths(r)
    slo = capacity.default_slo(cost, *lengths.means())
    slo = (P["slo_ttft_ms"] or slo[0], P["slo_tpot_ms"] or slo[1])
    sched = study1_runs.sim_kwargs_for(r.limits)({"scheduler": "chunked_prefill", "budget": None})
    make_trace = functools.partial(_capacity_trace, P, lengths)
    kw = dict(cost=cost, slo_ttft_ms=slo[0], slo_tpot_ms=slo[1], **sched)
    one = capacity.single_replica_rate(make_trace, **kw)
    if not np.isfinite(one):
        r.notes.append("One replica misses the SLO even at 1 req/s; the capacity rates are multiples of 1 req/s.")
        one = 1.0
    needed, tried = capacity.replicas_needed(
        make_trace,
        [one * m for m in P["capacity_rate_multiples"]],
        P["capacity_routers"],
        max_replicas=P["max_replicas"],
        time_budget_s=P["capacity_time_budget_s"],
        progress=False,
        **kw,
    )
    r.tables["capacity_needed"] = needed.assign(single_replica_rate=one)
    r.tables["capacity_tried"] = tried
    r.cap = dict(cost=cost, lengths=lengths, slo=slo, one=one, sched=sched)


def _affinity(r: Run) -> None:
    """The routers over replicas that each keep the engine's prefix cache, with a large and a small KV pool."""
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
    one = capacity.single_replica_rate(
        trace, cost=cost, slo_ttft_ms=slo[0], slo_tpot_ms=slo[1], prefix_caching=True, num_blocks=max(pools), **sched
    )
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
    r.tables["affinity_routing"] = table.assign(single_replica_rate=one)
    r.tables["affinity_gain"] = prefix_routing.affinity_gain(table)
    r.aff = dict(slo=slo, pools=pools, one=one)


def _speed(r: Run) -> None:
    P = r.P
    r.speed = speed.simulator_speed(
        r.cap["lengths"],
        cost=r.cap["cost"],
        rate=P["speed_rate"],
        duration_s=P["speed_duration_s"],
        replicas=P["speed_replicas"],
        seed=P["seed"],
        progress=False,
        **r.cap["sched"],
    )
    r.tables["sim_speed"] = pd.DataFrame([r.speed])


def run(P: dict) -> Run:
    """Every part of the page, in order; every table written; the run record finished."""
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    dev = device_record()
    ceil = measure_ceilings()  # recorded for the run; the simulator itself runs on one CPU core
    res = StudyResults(SLUG, dev, P, ceil)
    r = _real_runs(P, dev)
    gpu = _gpu_models(r)
    _validate(r, res, gpu)
    _ablate(r)
    _context_check(r, gpu)
    _study7_check(r, res)
    _capacity(r)
    _affinity(r)
    _speed(r)
    for name, df in r.tables.items():
        if not name.startswith("_") and df is not None and (len(df) or name != "sim_prefill_check"):
            res.write(name, df)
    res.finish()
    return r


# ---- the page's sections ------------------------------------------------------------------------------------
def show_verdicts(r: Run) -> None:
    show(
        verdict_table([r.f23]) if r.f23 is not None else None,
        None if r.f23 is not None else "No model with Study 2 costs was replayed: no F2.3 evidence.",
    )


def show_takeaways(r: Run) -> None:
    show(takeaways.headline(r))


def headline_figure(r: Run):
    """The one figure: real against simulated, every metric of every run, with the fitted serving overheads."""
    if not len(r["sim_validation"]):
        return None
    title = f"GPU costs + fitted serving overheads — {r.source}"
    return plots.plot_real_vs_sim(r["sim_validation"], "gpu+overheads", title=title)


def show_runs(r: Run) -> None:
    limits = ", ".join(f"{k}={v}" for k, v in r.limits.items())
    show(
        takeaways.takeaway_list(r.notes),
        f"{len(r['_runs'])} runs from {r.source}; server limits: {limits}; runs cut at {r.deadline_s} s.",
        r["_runs"],
        takeaways.takeaway_list(r.gpu_notes),
    )


def show_validation(r: Run) -> None:
    errors = r["sim_error_summary"]
    pivot = errors.pivot_table(index="metric", columns=["model", "cost_model", "subset"], values="median_abs_error_pct")
    table = r["sim_validation"]
    title = "simulation error on the validation runs, before and after the overhead terms"
    show(
        r["sim_calibration"].round(3),
        pivot.round(1) if len(errors) else None,
        plots.plot_error_before_after(table, title=title) if len(table) else None,
        takeaways.fidelity(r),
        heldout.section(study1_slug=r.s1_slug),  # which runs are fresh, which were used in development: the ledger
    )


def show_ablation(r: Run) -> None:
    show(takeaways.ablation_table(r).round(1), takeaways.ablation(r))


def show_context_reads(r: Run) -> None:
    c = r.context
    if not c:
        return
    title = f"{c['model']}: the longest walk over cached keys"
    show(plots.plot_context_reads(c["excess"], c["decode"], title=title), takeaways.context_reads(r))


def show_study7(r: Run) -> None:
    if r.study7 is None:
        return
    check, table = r["sim_prefill_check"], r["sim_prefix_validation"]
    err = check.assign(abs_err=check["error_pct"].abs()) if len(check) else check
    replay = table[table["cost_model"] == "gpu+overheads"]
    sens = r["sim_prefix_sensitivity"]
    first = r.table("sim_prefix_first_tokens")
    slug, model = r.study7.slug, r.study7.params["model"]
    show(
        takeaways.study7_setup(r),
        err.groupby(["cost_model", "mode"], sort=False)["abs_err"].median().unstack().round(1) if len(check) else None,
        plots.plot_prefill_check(
            check, title=f"Study 7's single prompts on {slug}: engine step time, measured and priced"
        )
        if len(check)
        else None,
        replay.pivot_table(index=["load", "caching"], columns="metric", values="error_pct", sort=False).round(1),
        r["sim_prefix_speedups"].round(2),
        plots.plot_prefix_replay(
            table,
            title=f"Study 7's server runs on {slug} ({model}), real against simulated "
            "(cost model calibrated on Study 1)",
        ),
        sens.pivot_table(
            index=["load", "caching"],
            columns="step_cost_factor",
            values=["ttft_p50_ms", "itl_p50_ms", "prefill_share"],
            sort=False,
        ).round(2),
        first.pivot_table(
            index=["load", "caching"], columns="quantile", values=["real_ms", "sim_ms"], sort=False
        ).round(0)
        if first is not None
        else None,
        takeaways.study7(r),
    )


def show_capacity(r: Run) -> None:
    needed, c = r["capacity_needed"], r.cap
    title = (
        f"{c['cost'].gpu.model} cost model (simulated), ChunkedPrefill, SLO p99 TTFT ≤ {c['slo'][0]:.0f} ms, "
        f"p99 TPOT ≤ {c['slo'][1]:.1f} ms"
    )
    show(
        takeaways.capacity_setup(r),
        plots.plot_capacity(needed, title=title),
        needed.pivot_table(index="rate", columns="router", values="replicas").round(0),
        takeaways.capacity(r),
    )


def show_affinity(r: Run) -> None:
    P = r.P
    title = (
        f"{P['affinity_replicas']} replicas, {P['affinity_prefixes']} system prompts of "
        f"{P['affinity_prefix_tokens']:,} tokens, {r.cap['cost'].gpu.model} cost model"
    )
    show(
        takeaways.affinity_setup(r),
        plots.plot_affinity(r["affinity_routing"], title=title),
        r["affinity_gain"].round(3),
        takeaways.affinity(r),
    )


def show_speed(r: Run) -> None:
    show(pd.DataFrame([r.speed]).T.rename(columns={0: "value"}), takeaways.speed(r))


def rerun(r: Run) -> str:
    extra = [
        "# the command line takes the cost model calibrated above (saved beside this study's tables):",
        "python -m servelab.sim --rate 100 --duration 600 --replicas 8 --router least_outstanding --step-graphs \\",
        "    --cost-model data/results/nvidia-h200/08_simulator/sim_cost_model_config_qwen2-0.5b.json --out sim.csv",
    ]
    return rerun_recipe(SLUG, r.P, out="book/simulator.ipynb", extra=extra)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("08_simulator")
