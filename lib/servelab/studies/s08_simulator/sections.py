"""The simulator page's sections: one call per section of the notebook, each showing the report's tables and figures
(``report.Study8Page``) with the sentences of ``takeaways``; every number comes from the report."""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.markdown import format_value
from servelab.studies.common.page import finding_sentence, show, takeaway_list
from servelab.studies.common.tested_on import model_name
from servelab.studies.s08_simulator import heldout, plots
from servelab.studies.s08_simulator import takeaways as tk
from servelab.studies.s08_simulator.source_words import gpu_source_words

NOT_MEASURED = "*Not measured.*"


def takeaways(r) -> str:
    """The findings' sentences, then the page's headline takeaways."""
    return takeaway_list([finding_sentence(f) for f in r.findings]) + (tk.headline(r) if r.study1 else "")


def headline_figure(r):
    """The one figure: real against simulated, every metric of every run, with the fitted serving overheads."""
    t = r["sim_validation"]
    if t.empty:
        return None
    return plots.plot_real_vs_sim(t, "gpu+overheads", title=f"GPU costs + fitted serving overheads — {r.source}")


def show_headline(r) -> None:
    fig = headline_figure(r)
    show(
        fig if fig is not None else NOT_MEASURED,
        "*Each metric of each held-out and calibration run of Study 1's server, real (x) against simulated (y) "
        "with Study 2's GPU costs and the fitted serving overheads; points on the diagonal are exact.*"
        if fig is not None
        else None,
    )


def show_runs(r) -> None:
    if not r.study1:
        show(takeaway_list(r.notes), NOT_MEASURED)
        return
    limits = ", ".join(f"{k}={v}" for k, v in r.limits.items())
    runs = r["_runs"]
    # Study 1 sizes each point's window on its own: its runs have no one deadline to name
    cut = f"; runs cut at {r.deadline_s:g} s" if r.deadline_s is not None else ""
    show(
        takeaway_list(r.notes),
        f"{len(runs)} runs from {r.source}; server limits: {limits}{cut}. Runs per model and policy:",
        named(
            runs.groupby(["model", "scheduler", "budget"], dropna=False)
            .agg(rates=("rate", "size"), requests=("requests", "sum"))
            .reset_index()
        ),
        takeaway_list(r.gpu_notes),
    )


def named(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its models as the reader knows them (``model_name``), in its ``model`` column or index."""
    if "model" in table.columns:
        return table.assign(model=table["model"].map(model_name))
    if table.index.name == "model":
        return table.rename(index=model_name)
    return table


def show_validation(r) -> None:
    errors, table = r["sim_error_summary"], r["sim_validation"]
    if table.empty:
        show(NOT_MEASURED)
        return
    pivot = errors[errors["metric"] == "all"].pivot_table(
        index="model", columns=["cost_model", "subset"], values="median_abs_error_pct"
    )
    pivot = named(pivot).rename(columns=COST_MODELS, level="cost_model")
    pivot.columns = pivot.columns.rename(["cost model", "runs"])
    show(
        calibration_view(r["sim_calibration"]),
        "Median |error| (%) over the six metrics, per model, cost model and subset:",
        pivot.round(1),
        plots.plot_error_before_after(table, title="simulation error, before and after the overhead terms"),
        "*Median |error| of each metric on the validation runs, with Study 2's GPU costs alone and with the fitted "
        "serving overheads.*",
        tk.fidelity(r),
    )


COST_MODELS = {"gpu_only": "GPU only", "gpu+overheads": "GPU + overheads"}  # as the page's prose names them
# the calibration's columns as headers, in the order shown: the GPU terms' own fit to the step log (a model Study 2
# did not time), the calibration steps before and after the serving terms, then the terms themselves
CALIBRATION_COLUMNS = {
    "model": "model",
    "gpu_source": "GPU terms",
    "prefill_median_abs_pct": "step-log GPU fit, steps with prefill: median |error| %",
    "prefill_max_abs_pct": "step-log GPU fit, steps with prefill: max |error| %",
    "decode_median_abs_pct": "step-log GPU fit, decode-only steps: median |error| %",
    "decode_max_abs_pct": "step-log GPU fit, decode-only steps: max |error| %",
    "median_abs_pct_before": "calibration steps, GPU terms alone: median |error| %",
    "p90_abs_pct_before": "calibration steps, GPU terms alone: p90 |error| %",
    "median_abs_pct_after": "calibration steps, with serving terms: median |error| %",
    "p90_abs_pct_after": "calibration steps, with serving terms: p90 |error| %",
    "step_median_abs_pct": "calibration steps, fitted model: median |error| %",
    "step_p90_abs_pct": "calibration steps, fitted model: p90 |error| %",
    "step_overhead_ms": "per-step overhead (ms)",
    "seq_overhead_ms": "per-sequence overhead (ms)",
    "mixed_step_ms": "mixed-step cost (ms)",
    "ingress_ms": "ingress delay (ms)",
    "status": "status",
}


def calibration_view(calib: pd.DataFrame) -> pd.DataFrame:
    """The calibration per model (``CALIBRATION_COLUMNS`` it has): errors to 0.1 %, times to 0.01 ms."""
    if "gpu_source" in calib.columns:
        words = [gpu_source_words(str(m), str(s)) for m, s in zip(calib["model"], calib["gpu_source"], strict=True)]
        calib = calib.assign(gpu_source=words)
    keep = [c for c in CALIBRATION_COLUMNS if c in calib.columns]
    digits = {c: 1 if "_pct" in c else 2 for c in keep}
    return named(calib[keep]).round(digits).rename(columns=CALIBRATION_COLUMNS)


def show_ablation(r) -> None:
    if r["sim_term_ablation"].empty:
        show(NOT_MEASURED)
        return
    show(tk.ablation_table(r).round(1), tk.ablation(r))


def show_context_reads(r) -> None:
    c = r.context
    if not c:
        show(NOT_MEASURED)
        return
    show(
        plots.plot_context_reads(
            c["excess"], c["decode"], title=f"{model_name(c['model'])}: the longest walk over cached keys"
        ),
        "*Left: Study 1's mixed steps, measured time less what the model prices apart from the longest walk, by the "
        "longest context in the step. Right: Study 2's decode steps, measured and as priced with and without the "
        "longest sequence.*",
        tk.context_reads(r),
    )


def heldout_text(r) -> str:
    """The fresh held-out run's error, once, or "not measured"; and the freeze and ledger behind it."""
    f = r.fresh
    if f.get("error"):
        head = f"**Fresh held-out run.** Not evaluated: {f['error']}."
    elif not f:
        head = (
            "**Fresh held-out run.** Not measured: no fresh run of the real server (the measuring path's `fresh_*` "
            "parts, drawn after the cost model was frozen, with a seed and rates no calibration used) is committed yet."
        )
    else:
        code = (
            "The cost-model code at that run matched the freeze."
            if f["code_matches"]
            else "The cost-model code at that run differed from the freeze: this error describes the frozen model, "
            "not the code that ran, and a new freeze with a new fresh run is needed."
        )
        per = f["per_repeat"]
        each = (
            f" (median over {len(per)} repeats; by seed: "
            + ", ".join(f"{seed} {err:.1f} %" for seed, err in per.items())
            + ")"
            if len(per) > 1
            else ""
        )
        head = (
            f"**Fresh held-out run.** Replayed on the frozen cost models (frozen {str(f['frozen_utc'])[:10]}, "
            f"no refit), the median |error| over six serving metrics of its {f['runs']} runs is "
            f"**{f['median_abs_error_pct']:.1f} %**{each}. {_fresh_models(f)}{code}"
            + (f" {f['drift_text']}" if f.get("drift_text") else "")
        )
    seeds = seeds_text(r)
    return (
        head
        + ("\n\n" + seeds if seeds else "")
        + "\n\n"
        + heldout.section(study1_slug=None)
        .split("\n", 1)[-1]
        .replace("The validation runs above are CPU stand-ins made by this run, not in the ledger. ", "")
    )


def _fresh_models(f: dict) -> str:
    """Which models the fresh runs so far replayed, where a frozen model's fresh part is not measured yet."""
    missing = f.get("missing_models") or []
    if not missing:
        return ""
    have = _listing([model_name(m) for m in f.get("models", [])])
    return (
        f"These runs are {have}'s alone: the fresh runs of {_listing([model_name(m) for m in missing])} are not "
        "measured yet, so this error is not yet the whole fresh run's. "
    )


def _listing(seeds) -> str:
    seeds = [str(x) for x in seeds]
    return seeds[0] if len(seeds) == 1 else ", ".join(seeds[:-1]) + " and " + seeds[-1]


def seeds_text(r) -> str:
    """Which seeds of the fresh run the ledger (``data/validation/ledger.csv``) registered and which it did not."""
    t = r["fresh_seeds"]
    if t.empty:
        return ""
    out = []
    for run_id, g in t.groupby("fresh_run", sort=True):
        reg, unreg = g[g["registered"]], g[~g["registered"]]
        if g["measured"].any():
            lead = f"The fresh runs of `{run_id}` here ran with seed{'s' if len(g) > 1 else ''} {_listing(g['seed'])}"
        else:
            lead = (
                f"Each repeat of a campaign runs `{run_id}` with its spec's seed plus the repeat's index (from 0): the "
                f"first {len(g)} repeats would run seeds {_listing(g['seed'])}"
            )
        said = []
        if len(reg) == len(g):
            said.append(f"{'all ' if len(g) > 2 else 'both ' if len(g) == 2 else ''}registered in the ledger")
        elif len(reg):
            said.append(f"{_listing(reg['seed'])} {'is' if len(reg) == 1 else 'are'} registered in the ledger")
        if len(unreg):
            said.append(
                f"{_listing(unreg['seed'])} {'is' if len(unreg) == 1 else 'are'} not (the ledger registered only "
                "the spec's own seed): an error on them is not one the ledger vouches for"
            )
        out.append(lead + ", " + "; ".join(said) + ".")
    return "**Seeds.** " + " ".join(out)


def show_study7(r) -> None:
    if r.study7 is None:
        show(takeaway_list(n for n in r.notes if "Study 7" in n) or NOT_MEASURED, heldout_text(r))
        return
    check, table = r["sim_prefill_check"], r["sim_prefix_validation"]
    err = check.assign(abs_err=check["error_pct"].abs()) if len(check) else check
    replay = table[table["cost_model"] == "gpu+overheads"]
    errors = replay.pivot_table(index=["load", "caching"], columns="metric", values="error_pct", sort=False).round(1)
    where, model = r.device, model_name(r.study7.params["model"])  # the device by name, not its folder's slug
    show(
        tk.study7_setup(r),
        "Median |error| (%) of the engine's step times of Study 7's single prompts, per cost model (rows) and prompt "
        "(columns: the whole prompt computed, or a suffix after a cached prefix):"
        if len(check)
        else None,
        err.groupby(["cost_model", "mode"], sort=False)["abs_err"].median().unstack().round(1).rename_axis("cost model")
        if len(check)
        else None,
        plots.plot_prefill_check(check, title=f"Study 7's single prompts on the {where}: engine step time")
        if len(check)
        else None,
        "*Study 7's single prompts, whole or a short suffix after a cached prefix: the engine's step time against "
        "the cost model's, with and without the two GPU terms.*"
        if len(check)
        else None,
        "Study 7's server runs replayed with the fitted serving overheads: the signed error of each number, "
        "(simulated − real) / real in % of the real value; negative: the simulator is faster (a time) or lower (the "
        "throughput) than the real server; — where the real value is zero or missing, so that no error is defined:",
        errors.astype(object).where(errors.notna(), "—"),
        plots.plot_prefix_replay(
            table, title=f"Study 7's server runs on the {where} ({model}), real against simulated"
        ),
        "*Study 7's server runs (Poisson and burst, caching off and on) replayed with the cost model calibrated on "
        "Study 1: nothing was fitted to these.*",
        tk.study7(r),
        heldout_text(r),
    )


def _span(values, fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}–{format(hi, fmt)}"


def _sizes(table: pd.DataFrame, what: str) -> str:
    """What each point of a simulated table covered: its requests and simulated seconds of arrivals (the table's
    ``requests`` over its ``rate``), from the simulations themselves."""
    if table.empty or "requests" not in table:
        return f"simulated {what}"
    seconds = table["requests"] / table["rate"]
    return f"{_span(table['requests'], ',.0f')} simulated requests per point, {_span(seconds, '.1f')} s of {what}"


def show_capacity(r) -> None:
    needed, c = r["capacity_needed"], r.cap
    if needed.empty:
        show(NOT_MEASURED)
        return
    title = f"{model_name(c['cost'].gpu.model)} cost model (simulated), SLO p99 TTFT ≤ {c['slo'][0]:.0f} ms"
    show(
        tk.capacity_setup(r),
        plots.plot_capacity(needed, title=title),
        f"*Fewest replicas meeting p99 TTFT ≤ {c['slo'][0]:.0f} ms and p99 TPOT ≤ {c['slo'][1]:.1f} ms behind each "
        f"router (ChunkedPrefill replicas; {_sizes(r['capacity_tried'], 'Poisson arrivals')}).*",
        capacity_view(needed),
        tk.capacity(r),
    )


def show_affinity(r) -> None:
    if r["affinity_routing"].empty:
        show(NOT_MEASURED)
        return
    P = r.P
    title = f"{P['affinity_replicas']} replicas, {P['affinity_prefixes']} system prompts"
    show(
        tk.affinity_setup(r),
        plots.plot_affinity(r["affinity_routing"], title=title),
        f"*{P['affinity_replicas']} replicas with prefix caches, {P['affinity_prefixes']} system prompts of "
        f"{P['affinity_prefix_tokens']:,} tokens, {_sizes(r['affinity_routing'], 'arrivals')}, two KV pool sizes.*",
        affinity_view(r["affinity_gain"]),
        tk.affinity(r),
    )


def show_speed(r) -> None:
    if not r.speed:
        show(NOT_MEASURED)
        return
    show(speed_view(r.speed), tk.speed(r))


def capacity_view(needed: pd.DataFrame) -> pd.DataFrame:
    """Replicas each router needs (columns) at each rate (rows, req/s to 3 significant figures)."""
    t = needed.pivot_table(index="rate", columns="router", values="replicas").round(0).astype("Int64")
    t = t.rename(columns=tk.router_words)
    t.index = [format_value(str(x)) for x in t.index]
    t.index.name = "rate (req/s)"
    return t


AFFINITY_COLUMNS = {
    "pool_blocks": "KV pool (blocks per replica)",
    "rate": "rate (req/s)",
    "affinity_hit_rate": "hit rate, prefix affinity (%)",
    "best_other_hit_rate": "hit rate, best other router (%)",
    "best_other": "other router with the lowest p99 TTFT",
    "affinity_ttft_p99_ms": "p99 TTFT, prefix affinity (ms)",
    "best_other_ttft_p99_ms": "p99 TTFT, that router (ms)",
    "ttft_p99_ratio": "p99 TTFT, affinity / that router",
}


def affinity_view(gain: pd.DataFrame) -> pd.DataFrame:
    """``prefix_routing.affinity_gain`` for reading: hit rates in %, rates in whole req/s, TTFT to 0.1 ms."""
    t = gain.assign(
        best_other=gain["best_other"].map(tk.router_words),
        rate=gain["rate"].round(0).astype(int),
        affinity_hit_rate=(100 * gain["affinity_hit_rate"]).round(1),
        best_other_hit_rate=(100 * gain["best_other_hit_rate"]).round(1),
    )
    return t.round({"affinity_ttft_p99_ms": 1, "best_other_ttft_p99_ms": 1, "ttft_p99_ratio": 2}).rename(
        columns=AFFINITY_COLUMNS
    )


def speed_view(speed: dict) -> pd.DataFrame:
    """The measuring run's speed, one row per quantity, numbers to 3 significant figures: the wall time is the
    first repeat's and the hour's the median over repeats where several timed it (``report._speed``)."""
    n = speed.get("repeats", 1)
    rows = {
        "rate (req/s)": speed.get("rate"),
        "replicas": speed.get("replicas"),
        "router": speed.get("router"),
        "simulated time (s)": speed.get("simulated_s"),
        "requests": speed.get("requests"),
        "steps": speed.get("steps"),
        "wall time" + (", first repeat" if n > 1 else "") + " (s)": speed.get("wall_s"),
        "one hour's wall time" + (f", median over {n} repeats" if n > 1 else "") + " (s)": speed.get("hour_wall_s"),
        "goal (s)": speed.get("goal_s"),
    }
    shown = {k: format_value(str(v)) for k, v in rows.items() if v is not None}
    return pd.DataFrame({"value": shown})
