"""Real against simulated: replay every run Study 1 measured and compare the load generator's metrics.

A **run** is one (model, scheduler, budget, rate) of Study 1's ``requests.csv``; its trace is the records'
own send times and lengths. Runs are split per model into a *calibration* subset (by default the 1st, 3rd, …
rate of each scheduler/budget, lowest first) whose step logs fit the serving overheads and the ingress delay,
and a *validation* subset never used for fitting. Each run is simulated with two cost models:

- ``gpu_only``: Study 2's GPU fit alone (what the simulator would say from the kernel measurements);
- ``gpu+overheads``: plus the per-step and per-sequence overheads and the ingress delay fitted on the
  calibration runs (issue 7's "missing cost terms").

``validation_table`` returns one row per run × cost model × metric: ``model, scheduler, budget, rate, subset,
cost_model, gpu_source, metric, real, sim, error_pct`` with ``error_pct = 100 · (sim − real) / real``;
``gpu_source`` says whether the GPU terms are Study 2's or were fitted to the step log (a model Study 2 did not
measure: then both cost models share them, and only the ingress delay differs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.metrics import check_records, summarize
from servelab.sim.calibration import fit_overheads, fit_step_log_model, predict_cycles, step_features
from servelab.sim.cost_model import StepCostModel
from servelab.sim.simulator import simulate

RUN_KEYS = ["model", "scheduler", "budget", "rate"]
METRICS = {
    "ttft_p50_ms": "p50 TTFT",
    "ttft_p99_ms": "p99 TTFT",
    "itl_p50_ms": "p50 ITL",
    "itl_p99_ms": "p99 ITL",
    "max_itl_ms": "max stall",
    "throughput_tok_s": "throughput",
}
COST_MODELS = ("gpu_only", "gpu+overheads")


def run_groups(requests: pd.DataFrame, steps: pd.DataFrame | None = None):
    """``(key, records, steps)`` per run, keys as dicts of ``RUN_KEYS`` (and ``sweep`` where Study 1 has it),
    sorted by model, scheduler, budget, rate."""
    missing = [c for c in RUN_KEYS if c not in requests.columns]
    if missing:
        raise ParameterError(f"Study 1 requests lack columns {missing}")
    keys = RUN_KEYS + (["sweep"] if "sweep" in requests.columns and (steps is None or "sweep" in steps.columns) else [])
    req = requests.copy()
    req["budget"] = req["budget"].fillna(-1)
    st = None
    if steps is not None:
        st = steps.copy()
        st["budget"] = st["budget"].fillna(-1)
    for key, g in req.groupby(keys, sort=True):
        k = dict(zip(keys, key, strict=True))
        s = None
        if st is not None:
            m = np.ones(len(st), dtype=bool)
            for c in keys:
                m &= (st[c] == k[c]).to_numpy()
            s = st[m]
        k["budget"] = None if k["budget"] == -1 else k["budget"]
        yield k, g.reset_index(drop=True), s


def replay_trace(records: pd.DataFrame, outputs: np.ndarray | None = None) -> pd.DataFrame:
    """The trace a run's records describe: their send times and prompt lengths, and ``outputs`` (the lengths
    requested) or else the tokens received (then requests that got none are dropped)."""
    r = check_records(records)
    out = r["output_tokens"].to_numpy(int) if outputs is None else np.asarray(outputs, dtype=int)
    keep = out >= 1
    sent = r["sent_s"].to_numpy(float)
    sent = np.where(np.isfinite(sent), sent, r["arrival_s"].to_numpy(float))  # never sent: due time
    return pd.DataFrame(
        {
            "request_id": r["request_id"].to_numpy()[keep],
            "arrival_s": r["arrival_s"].to_numpy(float)[keep],
            "sent_s": sent[keep],
            "prompt_tokens": r["prompt_tokens"].to_numpy(int)[keep],
            "output_tokens": out[keep],
        }
    )


def cut_at(records: pd.DataFrame, deadline_s: float | None, error: str = "cut at the run's deadline") -> pd.DataFrame:
    """The records as a client that stops listening at ``deadline_s`` (s on the records' clock) sees them:
    later tokens dropped, unfinished requests not ok. Study 1 cuts its runs this way."""
    if deadline_s is None:
        return records
    r = records.copy()
    times = [[t for t in ts if t <= deadline_s] for ts in r["token_times_s"]]
    late = r["finish_s"].to_numpy(float) > deadline_s
    r["token_times_s"] = times
    r["output_tokens"] = [len(ts) for ts in times]
    r["first_token_s"] = [ts[0] if ts else np.nan for ts in times]
    r.loc[late, "finish_s"] = np.nan
    r.loc[late, "ok"] = False
    r.loc[late, "error"] = error
    return r


def split_runs(keys: list[dict], every: int = 2) -> list[str]:
    """``calibration`` for the 1st, (1+every)th, … rate of each (model, scheduler, budget), lowest rate first;
    ``validation`` for the rest. A scheduler/budget with a single rate is validation only."""
    out = []
    by = {}
    for k in keys:
        by.setdefault((k["model"], k["scheduler"], k["budget"]), []).append(k["rate"])
    for k in keys:
        rates = sorted(by[(k["model"], k["scheduler"], k["budget"])])
        pos = rates.index(k["rate"])
        out.append("calibration" if len(rates) > 1 and pos % every == 0 else "validation")
    return out


def replay(
    key: dict,
    records: pd.DataFrame,
    cost: StepCostModel,
    sim_kwargs: Callable[[dict], dict],
    outputs_for: Callable | None = None,
    deadline_s: float | None = None,
) -> pd.DataFrame:
    """Simulate one real run on its own trace; the simulated records, cut like the real run."""
    outputs = outputs_for(key, records) if outputs_for is not None else None
    sim = simulate(replay_trace(records, outputs), cost=cost, **sim_kwargs(key))
    return cut_at(sim.records.drop(columns="replica"), deadline_s)


def runs_features(
    runs: list[tuple[dict, pd.DataFrame, pd.DataFrame]], sim_kwargs: Callable[[dict], dict]
) -> pd.DataFrame:
    """``calibration.step_features`` of every run of ``runs`` (``run_groups``' triples) that has a step log,
    each with its server's step-graph ladder, in one frame (empty without any)."""
    parts = [
        step_features(s, r, step_buckets=sim_kwargs(k).get("step_buckets"))
        for k, r, s in runs
        if s is not None and len(s)
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def calibrate(
    model: str,
    runs: list[tuple[dict, pd.DataFrame, pd.DataFrame]],
    base: StepCostModel | None,
    sim_kwargs: Callable[[dict], dict],
    outputs_for: Callable | None = None,
    deadline_s: float | None = None,
    context_reads: bool = True,
) -> tuple[StepCostModel, StepCostModel, dict]:
    """The two cost models for ``model`` from its calibration runs: ``(gpu_only, gpu+overheads, stats)``.
    Without ``base`` (no Study 2 fit for this model) the GPU terms are fitted to the step log too, with each
    step's longest walk over cached keys priced unless ``context_reads=False``."""
    feats = runs_features(runs, sim_kwargs)
    if feats.empty:
        raise ParameterError(f"{model}: the calibration runs have no step log")
    stats = {"model": model, "calibration_runs": len(runs)}
    if base is None:
        full, st = fit_step_log_model(feats, model, context_reads=context_reads)
        gpu_only, with_over = full, full
        stats.update({"gpu_source": "step log (calibration runs)", **st})
    else:
        gpu_only = base
        with_over, st = fit_overheads(base, feats)
        stats.update({"gpu_source": base.source, **st})
    # ingress: what TTFT lacks once steps are right: the median residual over the requests of the least loaded
    # calibration run of each policy (where queueing, which the steps already model, matters least)
    lowest = {}
    for k, _, _ in runs:
        g = (k["scheduler"], k["budget"])
        lowest[g] = min(lowest.get(g, np.inf), k["rate"])
    resid = []
    for k, rec, _ in runs:
        if k["rate"] != lowest[(k["scheduler"], k["budget"])]:
            continue
        sim = replay(k, rec, with_over, sim_kwargs, outputs_for, deadline_s)
        real = rec.set_index("request_id")
        s = sim.set_index("request_id")
        both = real.index.intersection(s.index)
        d = (
            (real.loc[both, "first_token_s"] - real.loc[both, "sent_s"])
            - (s.loc[both, "first_token_s"] - s.loc[both, "sent_s"])
        ) * 1e3
        resid.append(d.dropna().to_numpy())
    ingress = max(0.0, float(np.median(np.concatenate(resid)))) if resid and sum(map(len, resid)) else 0.0
    with_over = with_over.with_overheads(ingress_ms=ingress, source=with_over.source + f" + ingress {ingress:.2f} ms")
    # the step-level check, one number for either kind of fit: the fitted model's step times against the log's
    y = feats["cycle_ms"].to_numpy(float)
    step_err = 100 * np.abs(predict_cycles(with_over, feats) - y) / y
    stats.update(
        {"step_median_abs_pct": float(np.median(step_err)), "step_p90_abs_pct": float(np.percentile(step_err, 90))}
    )
    stats.update(
        {
            "prefill_scale": with_over.prefill_scale,
            "decode_scale": with_over.decode_scale,
            "ms_per_context_pair": with_over.ms_per_context_pair,
            "step_overhead_ms": with_over.step_overhead_ms,
            "seq_overhead_ms": with_over.seq_overhead_ms,
            "prefill_fixed_scale": with_over.prefill_fixed_scale,
            "mixed_step_ms": with_over.mixed_step_ms,
            "ingress_ms": ingress,
        }
    )
    return gpu_only, with_over, stats


def compare(real: dict, sim: dict) -> list[dict]:
    rows = []
    for key, label in METRICS.items():
        a, b = real.get(key, np.nan), sim.get(key, np.nan)
        err = 100.0 * (b - a) / a if a and np.isfinite(a) and np.isfinite(b) else np.nan
        rows.append({"metric": label, "real": a, "sim": b, "error_pct": err})
    return rows


def validation_table(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    gpu_models: dict[str, StepCostModel | None],
    *,
    sim_kwargs: Callable[[dict], dict],
    every: int = 2,
    outputs_for: Callable | None = None,
    deadline_s: float | None = None,
    progress: bool = False,
    context_reads: bool = True,
    replayed: tuple[str, ...] = ("gpu_only", "gpu+overheads"),
    held_out_only: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Simulate every run of Study 1 with both cost models. ``gpu_models``: model → Study 2's cost model (None:
    fit from the step log). ``sim_kwargs(run_key)``: the server limits of a run (``scheduler``,
    ``max_num_batched_tokens``, ``max_num_seqs``, ``num_blocks`` …); ``outputs_for(run_key, records)``: the
    output lengths the run requested (None: the tokens received); ``deadline_s``: where the real runs were cut
    (the simulated ones are cut there too); ``context_reads=False``: a model fitted to the step log leaves the
    steps' longest walks over cached keys unpriced (``servelab.studies.s08_simulator.ablation``); ``replayed``: the
    cost models whose replays the table holds (both are fitted either way); ``held_out_only``: replay only the
    runs held out from the fit (all of a model's runs where none is held out). Returns ``(table, calibration stats,
    fitted models keyed by model)``."""
    from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

    runs = list(run_groups(requests, steps))
    if not runs:
        raise ParameterError("Study 1's requests hold no runs")
    subsets = split_runs([k for k, _, _ in runs], every)
    rows, stats, fitted = [], [], {}
    with tqdm(total=len(runs), desc="replay Study 1 runs", unit="run", disable=not progress) as bar:
        for model in sorted({k["model"] for k, _, _ in runs}):
            mine = [(run, sub) for run, sub in zip(runs, subsets, strict=True) if run[0]["model"] == model]
            # nothing held out: fit on all of this model's runs, and say so in the subset column
            cal = [run for run, sub in mine if sub == "calibration"] or [run for run, _ in mine]
            try:
                gpu_only, with_over, st = calibrate(
                    model, cal, gpu_models.get(model), sim_kwargs, outputs_for, deadline_s, context_reads=context_reads
                )
            except Exception as e:  # one model that cannot be calibrated must not end the notebook
                stats.append({"model": model, "status": f"error: {type(e).__name__}: {e}"[:300]})
                bar.update(len(mine))
                continue
            stats.append({**st, "status": "ok"})
            fitted[model] = {"gpu_only": gpu_only, "gpu+overheads": with_over}
            tags = {"gpu_source": "Study 2" if gpu_models.get(model) is not None else "step log"}
            for (k, rec, _), sub in mine:
                tags["subset"] = sub if len(cal) < len(mine) else "calibration"
                if held_out_only and len(cal) < len(mine) and sub == "calibration":
                    bar.update(1)
                    continue
                replay_models = {name: cm for name, cm in fitted[model].items() if name in replayed}
                rows += _run_rows(k, rec, replay_models, tags, sim_kwargs, outputs_for, deadline_s)
                bar.update(1)
    cols = (
        list(rows[0])
        if rows
        else RUN_KEYS + ["subset", "cost_model", "gpu_source", "metric", "real", "sim", "error_pct", "note"]
    )
    return pd.DataFrame(rows, columns=cols), pd.DataFrame(stats), fitted


def _run_rows(key: dict, rec, models: dict, tags: dict, sim_kwargs, outputs_for, deadline_s) -> list[dict]:
    """One real run against its replay on each cost model of ``models``: a row per metric, with ``tags``
    (subset, GPU source) and a note where the replay failed."""
    real = summarize(rec)
    rows = []
    for name, cm in models.items():
        try:
            sim, note = summarize(replay(key, rec, cm, sim_kwargs, outputs_for, deadline_s)), ""
        except Exception as e:  # recorded in the table's note column
            sim, note = {}, f"error: {type(e).__name__}: {e}"[:300]
        for row in compare(real, sim):
            rows.append(
                {
                    **key,
                    "subset": tags["subset"],
                    "cost_model": name,
                    "gpu_source": tags["gpu_source"],
                    **row,
                    "note": note,
                }
            )
    return rows


def error_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median |error| (%) per cost model and subset, and per metric, over all models (``model == "all"``) and
    per model."""
    t = table.dropna(subset=["error_pct"]).assign(abs_error_pct=lambda d: d["error_pct"].abs())
    parts = []
    for model, g in [("all", t), *t.groupby("model")]:
        overall = g.groupby(["cost_model", "subset"], as_index=False)["abs_error_pct"].median()
        overall["metric"] = "all"
        per_metric = g.groupby(["cost_model", "subset", "metric"], as_index=False)["abs_error_pct"].median()
        parts.append(pd.concat([overall, per_metric], ignore_index=True).assign(model=model))
    cols = ["model", "cost_model", "subset", "metric", "abs_error_pct"]
    out = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
    return out.rename(columns={"abs_error_pct": "median_abs_error_pct"})
