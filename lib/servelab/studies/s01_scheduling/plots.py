"""Study 1's figures (matplotlib/seaborn); each returns its Figure, the notebook shows it.

A *setting* is a policy with its budget (``chunked_prefill@512``); FCFS and EagerContBatch prefill whole
prompts, so their budget is not part of their name. The RTX 2070's worst-case stalls (claim F1.1) are
drawn, labelled as the seed's, where stalls are plotted.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import LogFormatter

from servelab.studies.s01_scheduling.verdicts import SEED_STALL_CHUNKED_MS, SEED_STALL_EAGER_MS, short

ORDER = ["fcfs", "eager_cont_batch", "chunked_prefill"]


def _plain_log_ticks(fig) -> None:
    """Log-axis tick labels as plain numbers ("100", not mathtext 10²): the same ticks, and no mathtext to typeset
    (most of a figure's drawing time went there)."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() in ("log", "symlog"):
                base = getattr(axis.get_transform(), "base", 10)
                axis.set_major_formatter(LogFormatter(base=base))
                axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _finish(fig, title: str | None = None):
    """Every figure's last step: ticks relabelled before the layout is fitted, as their labels' sizes move it."""
    if title is not None:
        fig.suptitle(title)
    _plain_log_ticks(fig)
    fig.tight_layout()
    return fig


def setting(scheduler: pd.Series, budget: pd.Series) -> pd.Series:
    return pd.Series(
        np.where(scheduler == "chunked_prefill", scheduler + "@" + budget.astype(str), scheduler), index=scheduler.index
    )


def _settings_order(df: pd.DataFrame) -> list[str]:
    keys = df[["scheduler", "budget"]].drop_duplicates()
    keys = keys.assign(o=keys["scheduler"].map(ORDER.index)).sort_values(["o", "budget"])
    return setting(keys["scheduler"], keys["budget"]).tolist()


def _seed_stalls(ax, axis: str = "x") -> None:
    line = ax.axvline if axis == "x" else ax.axhline
    line(SEED_STALL_EAGER_MS, color="grey", ls=":", lw=1, label="RTX 2070 worst stall, EagerContBatch (seed)")
    line(SEED_STALL_CHUNKED_MS, color="grey", ls="--", lw=1, label="RTX 2070 worst stall, ChunkedPrefill (seed)")


def _quantile_curve(values, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """An empirical CDF drawn through ``n`` quantiles (not every sample: the SVG stays small)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    q = np.linspace(0, 1, n)
    return (np.quantile(v, q), q) if v.size else (np.array([]), np.array([]))


def latency_cdfs(req_metrics: pd.DataFrame, model: str, rate_fraction: float, device: str):
    """TTFT and ITL CDFs of every setting of one model at one rate fraction, drawn through 200 quantiles each."""
    d = req_metrics[
        (req_metrics["sweep"] == "rate")
        & (req_metrics["rate_fraction"] == rate_fraction)
        & req_metrics["ok"]
        & (req_metrics["model"] == model)
    ]
    if d.empty:  # a part that did not run this rate (yet): say so rather than draw empty axes
        fig, ax = plt.subplots(figsize=(8.0, 1.2))
        msg = f"{short(model)}: no run at {rate_fraction:g}× capacity measured yet"
        ax.text(0.5, 0.5, msg, ha="center", va="center")
        ax.set_axis_off()
        return fig
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for name in _settings_order(d):
        g = d[d["setting"] == name]
        a0.plot(*_quantile_curve(g["ttft_ms"]), label=name)
        gaps = np.concatenate([np.asarray(x, dtype=float) for x in g["itl"]]) if len(g) else []
        a1.plot(*_quantile_curve(gaps), label=name)
    _seed_stalls(a1)
    rate = d["rate"].iloc[0]
    a0.set(xscale="log", xlabel="time to first token (ms)", ylabel="fraction of requests")
    a1.set(xscale="log", xlabel="inter-token latency (ms)", ylabel="fraction of token gaps")
    a0.set_title(f"TTFT at {rate:.2f} req/s", fontsize=10)
    a1.set_title(f"ITL at {rate:.2f} req/s", fontsize=10)
    a0.legend(fontsize=9)
    return _finish(fig, f"{short(model)} on {device}")


def stall_distribution(req_metrics: pd.DataFrame, device: str):
    """Each request's worst decode stall (its max ITL), per setting and rate, one panel per model."""
    import seaborn as sns  # only this figure uses it

    d = req_metrics[(req_metrics["sweep"] == "rate") & req_metrics["max_itl_ms"].notna()]
    models = list(dict.fromkeys(d["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(8.0, 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        g = d[d["model"] == model].copy()
        g["rate (req/s)"] = g["rate"].map(lambda r: f"{r:.2f}")
        sns.boxplot(
            data=g,
            x="rate (req/s)",
            y="max_itl_ms",
            hue="setting",
            hue_order=_settings_order(g),
            log_scale=True,
            ax=ax,
            showfliers=False,
        )
        _seed_stalls(ax, "y")
        ax.set(ylabel="worst stall per request: max ITL (ms)", title=f"{short(model)}: decode stalls")
        ax.legend(fontsize=9)
    return _finish(fig, f"Decode stalls on {device}")


def throughput_latency(summary: pd.DataFrame, device: str):
    """Delivered throughput against p99 ITL and p50 TTFT, a line per setting through its rates; the ITL
    SLO of the capacity definition drawn."""
    s = summary[(summary["status"] == "ok") & (summary["sweep"] == "rate")].copy()
    s["setting"] = setting(s["scheduler"], s["budget"])
    models = list(dict.fromkeys(s["model"]))
    fig, axes = plt.subplots(len(models), 2, figsize=(8.0, 3.2 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        g = s[s["model"] == model].sort_values("rate")
        order = _settings_order(g)
        for ax, y, label in (
            (row[0], "itl_p99_ms", "p99 inter-token latency (ms)"),
            (row[1], "ttft_p50_ms", "median TTFT (ms)"),
        ):
            for name in order:  # a line per setting through its rates (plain lines: no seaborn estimator pass)
                d = g[g["setting"] == name].dropna(subset=["delivered_tok_s", y])
                ax.plot(d["delivered_tok_s"], d[y], "o-", label=name)
            ax.set(xlabel="delivered throughput (output tokens/s)", ylabel=label, yscale="log", title=f"{short(model)}")
        slo = g["slo_itl_ms"].dropna()
        if len(slo):
            row[0].axhline(slo.iloc[0], color="red", ls="--", lw=1, label=f"ITL SLO {slo.iloc[0]:.1f} ms")
        row[0].legend(fontsize=9)
        row[1].legend(fontsize=9)
    return _finish(fig, f"Throughput against latency on {device} (each point one offered rate)")


NOT_MEASURED = "not measured"


def capacity_bars(capacity: pd.DataFrame, device: str):
    """Capacity at the ITL SLO per setting, one panel per model: a bar to the highest rate that met the SLO and a
    tick at the lowest that missed it (the bracket). A setting that missed at every rate has no bar: it says "below
    the lowest rate measured" and draws that rate; one never measured says "not measured". Empty data: one panel
    that says so (never a log axis over nothing)."""
    c = capacity.copy()
    models = list(dict.fromkeys(c["model"])) if "model" in c and len(c) else []
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(min(8.0, 4.0 * max(1, len(models))), 3.4), squeeze=False)
    if not models:
        ax = axes[0, 0]
        ax.text(0.5, 0.5, "capacity: " + NOT_MEASURED, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    c["setting"] = setting(c["scheduler"], c["budget"])
    for ax, model in zip(axes[0], models, strict=True):
        g = c[c["model"] == model].set_index("setting").loc[_settings_order(c[c["model"] == model])]
        y = np.arange(len(g))
        cap = pd.to_numeric(g["capacity_req_s"], errors="coerce").to_numpy(dtype=float)
        miss = pd.to_numeric(g.get("first_miss_rate", pd.Series(np.nan, index=g.index)), errors="coerce").to_numpy(
            dtype=float
        )
        ok = np.isfinite(cap) & (cap > 0)
        ax.barh(y[ok], cap[ok], color="tab:blue", label="met the SLO up to")
        has_miss = np.isfinite(miss) & (miss > 0)
        ax.plot(miss[has_miss], y[has_miss], "|", color="tab:red", ms=14, mew=2, label="first rate that missed")
        for i, (_, r) in enumerate(g.iterrows()):
            if not ok[i]:
                low = r.get("lowest_rate")
                text = f"below the lowest rate ({low:.3g} req/s)" if pd.notna(low) and low > 0 else NOT_MEASURED
                ax.text(0.02, i, text, va="center", fontsize=9, transform=ax.get_yaxis_transform())
        top = np.nanmax(np.concatenate([cap[ok], miss[has_miss], [0.0]]))
        ax.set_xlim(0, top * 1.15 if top > 0 else 1.0)
        ax.set_yticks(y, g.index)
        ax.set(xlabel="requests/s", title=f"{short(model)}: p99 ITL ≤ {g['slo_itl_ms'].iloc[0]:.1f} ms")
    axes[0, 0].legend(fontsize=9, loc="lower right")
    return _finish(fig, f"Capacity at an ITL SLO on {device}")


def stall_by_rate(summary: pd.DataFrame, device: str):
    """The key figure: each setting's worst stall (the p99 of the per-request maximum ITL, with its 95% bootstrap
    interval) against the offered rate, one panel per model, the seed's RTX 2070 stalls drawn."""
    s = summary[(summary["status"] == "ok") & (summary["sweep"] == "rate")].dropna(subset=["max_itl_p99_ms"])
    models = list(dict.fromkeys(s["model"]))
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(8.0, 3.6), squeeze=False)
    if not models:
        axes[0, 0].text(0.5, 0.5, NOT_MEASURED, ha="center", va="center", transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
        return fig
    s = s.assign(setting=setting(s["scheduler"], s["budget"]))
    for ax, model in zip(axes[0], models, strict=True):
        g = s[s["model"] == model]
        for name in _settings_order(g):
            d = g[g["setting"] == name].sort_values("rate")
            v = d["max_itl_p99_ms"]
            err = np.vstack([v - d["max_itl_p99_lo_ms"], d["max_itl_p99_hi_ms"] - v])
            ax.errorbar(d["rate"], v, yerr=np.nan_to_num(err.clip(min=0)), marker="o", capsize=3, label=name)
        _seed_stalls(ax, "y")
        ax.set(xlabel="offered rate (req/s)", ylabel="worst stall: p99 of per-request max ITL (ms)", yscale="log")
        ax.set_title(short(model))
    axes[0, -1].legend(fontsize=9)
    return _finish(fig)


def stall_window(steps: pd.DataFrame, span_s: float = 1.0) -> tuple[float, float]:
    """A window of ``span_s`` seconds around the run's longest step (where the worst stall comes from)."""
    if steps.empty:
        return 0.0, span_s
    i = (steps["end_s"] - steps["start_s"]).idxmax()
    mid = float(steps.loc[i, "start_s"])
    return max(0.0, mid - span_s / 2), max(0.0, mid - span_s / 2) + span_s


def _step_edges(start, end) -> tuple[np.ndarray, np.ndarray]:
    """The bin edges s0, e0, s1, e1, ..., en of a run of engine steps (each step a bin, each gap between one step's
    end and the next one's start a bin of its own), and which bins are steps."""
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    edges = np.column_stack([start, end]).ravel()
    is_step = np.arange(edges.size - 1) % 2 == 0
    return edges, is_step


def _step_band(ax, edges, is_step, high, **kw) -> None:
    """Each engine step as a band from 0 to ``high`` over its own time, all steps ONE filled path (a bar per step
    would put hundreds of rectangles into the SVG); nothing between steps."""
    ax.stairs(np.where(is_step, np.repeat(np.asarray(high, dtype=float), 2)[:-1], 0.0), edges, fill=True, lw=0, **kw)


def _step_segments(start, end, y) -> tuple[np.ndarray, np.ndarray]:
    """A horizontal segment at ``y`` over each step's span, as one polyline broken by NaN."""
    n = len(y)
    xs = np.column_stack([start, end, np.full(n, np.nan)]).ravel()
    ys = np.column_stack([y, y, np.full(n, np.nan)]).ravel()
    return xs, ys


def timeline(steps: pd.DataFrame, model: str, rate_fraction: float, device: str, span_s: float = 0.5):
    """Per setting, the tokens of each engine step (prefill stacked on decode) over time, around the
    run's longest step, with each step's duration."""
    d = steps[(steps["model"] == model) & (steps["sweep"] == "rate") & (steps["rate_fraction"] == rate_fraction)]
    order = _settings_order(d) if len(d) else []
    fig, axes = plt.subplots(max(1, len(order)), 1, figsize=(8.0, 2.3 * max(1, len(order))), squeeze=False)
    d = d.assign(setting=setting(d["scheduler"], d["budget"]))
    if not order:  # a part that did not run this rate (yet): one panel that says so, not a missing figure
        axes[0, 0].text(0.5, 0.5, f"no run at {rate_fraction:g}× capacity measured yet", ha="center", va="center")
        axes[0, 0].set_axis_off()
    for ax, name in zip(axes[:, 0], order, strict=False):
        g = d[d["setting"] == name]
        lo, hi = stall_window(g, span_s)
        w = g[(g["start_s"] >= lo) & (g["start_s"] <= hi)]
        dec = w["decode_tokens"].to_numpy(dtype=float)
        pre = dec + w["prefill_tokens"].to_numpy(dtype=float)
        edges, is_step = _step_edges(w["start_s"], w["end_s"])
        if len(w):  # the stack drawn as two bands from 0: the total (prefill on top), then decode over it
            _step_band(ax, edges, is_step, pre, color="tab:orange", label="prefill tokens")
            _step_band(ax, edges, is_step, dec, color="tab:blue", label="decode tokens")
        ax.set_yscale("symlog", linthresh=10)  # a few decode tokens stay visible under thousands of prefill
        ax.set(
            ylabel="tokens / step",
            xlim=(lo, hi),
            title=f"{name}: longest step {(g['end_s'] - g['start_s']).max() * 1e3:.1f} ms" if len(g) else name,
        )
        ax2 = ax.twinx()
        ms = (w["end_s"] - w["start_s"]).to_numpy() * 1e3
        ax2.plot(*_step_segments(w["start_s"], w["end_s"], ms), color="k", lw=1.2, label="step time")
        ax2.set(ylabel="step (ms)", ylim=(0, None))
        handles, labels = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(handles[::-1] + h2, labels[::-1] + l2, loc="upper left", fontsize=9)
    axes[-1, 0].set_xlabel("time since the run started (s)")
    rate = d["rate"].iloc[0] if len(d) else float("nan")
    return _finish(fig, f"{short(model)} on {device}: batch composition per engine step at {rate:.2f} req/s")


def budget_sweep(summary: pd.DataFrame, model: str, rate_fraction: float, device: str):
    """ChunkedPrefill's budget against its worst stall, p99 ITL, mean TTFT and throughput at one rate, with
    EagerContBatch and FCFS at the same rate as horizontal lines."""
    s = summary[(summary["status"] == "ok") & (summary["model"] == model) & (summary["rate_fraction"] == rate_fraction)]
    c = s[s["scheduler"] == "chunked_prefill"].sort_values("budget")
    fig, axes = plt.subplots(2, 2, figsize=(8.0, 5.6))
    axes = axes.ravel()
    for ax, y, label in zip(
        axes,
        ["max_itl_p99_ms", "itl_p99_ms", "mean_ttft_ms", "delivered_tok_s"],
        ["worst stall: p99 of per-request max (ms)", "p99 ITL (ms)", "mean TTFT (ms)", "delivered tokens/s"],
        strict=True,
    ):
        ax.plot(c["budget"], c[y], "o-", label="chunked_prefill")
        for name, ls in (("eager_cont_batch", "--"), ("fcfs", ":")):
            v = s.loc[s["scheduler"] == name, y]
            if len(v):
                ax.axhline(v.iloc[0], color="k", ls=ls, lw=1, label=name)
        ax.set(xscale="log", xlabel="token budget per step", ylabel=label)
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=9)
    rate = s["rate"].iloc[0] if len(s) else float("nan")
    return _finish(fig, f"{short(model)} on {device}: ChunkedPrefill's token budget at {rate:.2f} req/s")
