"""Study 2 figures, each readable at the book's column width (8 in at most, two panels across): every curve against
its roofline floor, the seed's (RTX 2070) value drawn where the seed gave one.

Lines are drawn with matplotlib directly (no seaborn estimators: each point is already one median over repeats), and
the figures with hundreds of points rasterize their markers, so that a page's SVG stays small and quick to render.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from servelab.studies.common.roofline_plot import roofline_plot
from servelab.studies.common.style import color
from servelab.studies.common.tested_on import model_name
from servelab.studies.s02_gpu_costs.verdicts import SEED_DECODE_US_PER_TOKEN, SEED_PREFILL_US_PER_TOKEN

MODE_LABELS = {
    "hf_eager": "HF eager",
    "hf_cuda_graph": "HF in a CUDA graph",
    "engine": "servelab engine",
    "engine_eager": "servelab engine, no graphs",
}
PHASE_MARKERS = {"prefill": "o", "decode": "s", "mixed": "D"}
PHASE_COLORS = {"prefill": color("engine"), "decode": color("engine_eager"), "mixed": color("hf_cuda_graph")}
SEED_COLOR = "tab:red"
WIDTH = 8.0  # inches: the book's text column
ROOFLINE_MODE = "engine"  # the engine with CUDA graphs: the mode whose steps the server runs


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if len(df) else df


def _modes(d: pd.DataFrame) -> list[str]:
    return [m for m in MODE_LABELS if m in set(d["mode"])]


def _models(d: pd.DataFrame) -> list[str]:
    return sorted(d["model"].unique())


def _panels(n: int, height: float = 3.6, cols: int = 2):
    """``n`` panels, at most ``cols`` across, the whole figure ``WIDTH`` wide."""
    cols = max(1, min(cols, n))
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_axis_off()
    return fig, flat[:n]


def _legend_below(fig, axes, ncol: int = 3) -> None:
    """One legend for the figure, below its panels (labels de-duplicated across panels)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.tight_layout()
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol)


def _seed_band(ax, band: tuple[float, float], what: str) -> None:
    lo, hi = band
    ax.axhspan(lo, hi, color=SEED_COLOR, alpha=0.12, label=f"RTX 2070 (seed): {lo:,.0f}–{hi:,.0f} {what}")


def _us_per_token(d: pd.DataFrame, x: str, seed_band: tuple[float, float], xlabel: str, ylabel: str, title: str):
    """µs/token against ``x``, one line per mode, one panel per model; the roofline floor (``floor_us_per_token``)
    and the seed's band drawn."""
    models = _models(d)
    fig, axes = _panels(len(models))
    for ax, m in zip(axes, models, strict=True):
        dm = d[d["model"] == m]
        for mode in _modes(dm):
            g = dm[dm["mode"] == mode].sort_values(x)
            ax.plot(g[x], g["us_per_token"], marker="o", ms=3, color=color(mode), label=MODE_LABELS[mode])
        f = dm.groupby(x)["floor_us_per_token"].min()
        ax.plot(f.index, f.values, "k--", lw=1, label="roofline floor")
        _seed_band(ax, seed_band, "µs/token")
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel)
        ax.set_title(model_name(m))
    fig.suptitle(title, y=1.0)
    _legend_below(fig, axes)
    return fig


def prefill_cost(steps: pd.DataFrame, device_name: str):
    """F2.1: prefill µs/token at batch 1 against prompt length, one line per mode, one panel per model; the roofline
    floor and the seed's 30–70 µs/token band drawn."""
    d = _ok(steps)
    d = d[(d["phase"] == "prefill") & (d["context"] == 0) & (d["batch"] == 1)]
    d = d.assign(floor_us_per_token=d["floor_ms"] * 1e3 / d["new_tokens"])
    title = f"Prefill at batch 1 on {device_name}"
    return _us_per_token(
        d, "new_tokens", SEED_PREFILL_US_PER_TOKEN, "prompt length (tokens)", "prefill (µs/token)", title
    )


def prefill_throughput(steps: pd.DataFrame, ceilings, device_name: str):
    """Achieved TFLOP/s of every fresh prefill against the tokens in the step (batch × prompt), one panel per
    model, against the run's measured matmul ceiling."""
    d = _ok(steps)
    d = d[(d["phase"] == "prefill") & (d["context"] == 0)]
    d = d.assign(step_tokens=d["batch"] * d["new_tokens"])
    models = _models(d)
    fig, axes = _panels(len(models))
    for ax, m in zip(axes, models, strict=True):
        dm = d[d["model"] == m]
        for mode in _modes(dm):
            g = dm[dm["mode"] == mode].groupby("step_tokens")["achieved_tflop_s"].median()
            ax.plot(g.index, g.values, marker="o", ms=3, color=color(mode), label=MODE_LABELS[mode])
        ax.axhline(ceilings.matmul_tflop_s, color="k", ls="--", lw=1, label="measured matmul ceiling")
        ax.set(xscale="log", yscale="log", xlabel="tokens in the step (batch × prompt)", ylabel="achieved TFLOP/s")
        ax.set_title(model_name(m))
    fig.suptitle(f"Prefill throughput on {device_name} (median over batch shapes of the same size)", y=1.0)
    _legend_below(fig, axes)
    return fig


def decode_single(steps: pd.DataFrame, device_name: str):
    """F2.2: single-request decode, µs/token against context, one line per mode, one panel per model; the roofline
    floor and the seed's 5,300–10,800 µs/token band drawn."""
    d = _ok(steps)
    d = d[(d["phase"] == "decode") & (d["batch"] == 1)]
    d = d.assign(floor_us_per_token=d["floor_ms"] * 1e3)  # one token per step
    title = f"Single-request decode on {device_name}"
    return _us_per_token(d, "context", SEED_DECODE_US_PER_TOKEN, "context (cached tokens)", "decode (µs/token)", title)


def decode_cost(steps: pd.DataFrame, model: str, device_name: str):
    """One model's decode step time against context, one line per batch size, one panel per mode (2 across), each
    batch's roofline floor dotted in its colour; whiskers: the interquartile range over the timed repeats."""
    d = _ok(steps)
    d = d[(d["phase"] == "decode") & (d["model"] == model)]
    modes = _modes(d)
    batches = sorted(d["batch"].unique())
    shade = dict(zip(batches, plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(batches), 1))), strict=True))
    fig, axes = _panels(len(modes), height=3.3)
    for ax, mode in zip(axes, modes, strict=True):
        dd = d[d["mode"] == mode]
        for b in batches:
            g = dd[dd["batch"] == b].sort_values("context")
            if g.empty:
                continue
            ax.errorbar(
                g["context"],
                g["median_ms"],
                yerr=[g["median_ms"] - g["p25_ms"], g["p75_ms"] - g["median_ms"]],
                marker="o",
                ms=3,
                color=shade[b],
                label=f"batch {b}",
            )
            ax.plot(g["context"], g["floor_ms"], ":", color=shade[b], lw=1)
        ax.set(xscale="log", yscale="log", xlabel="context (cached tokens)", ylabel="decode step (ms)")
        ax.set_title(MODE_LABELS[mode])
    ax0 = axes[0] if axes else None
    if ax0 is not None:
        ax0.plot([], [], "k:", lw=1, label="roofline floor (per batch)")
    fig.suptitle(f"{model_name(model)}: decode step on {device_name}", y=1.0)
    _legend_below(fig, axes, ncol=6)
    return fig


def pct_of_floor(steps: pd.DataFrame, model: str, device_name: str):
    """One model's decode: % of the roofline floor reached (batch × context), one heatmap per mode (2 across)."""
    d = _ok(steps)
    d = d[(d["phase"] == "decode") & (d["model"] == model)]
    modes = _modes(d)
    fig, axes = _panels(len(modes), height=2.9)
    im = None
    for ax, mode in zip(axes, modes, strict=True):
        t = d[d["mode"] == mode].pivot_table(index="batch", columns="context", values="pct_of_floor")
        im = ax.imshow(t.to_numpy(), cmap="viridis", vmin=0, vmax=100, aspect="auto")
        for (i, j), v in np.ndenumerate(t.to_numpy()):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=9, color="w" if v < 60 else "k")
        ax.set_xticks(range(t.shape[1]), [f"{c:,}" for c in t.columns], rotation=30)
        ax.set_yticks(range(t.shape[0]), [str(b) for b in t.index])
        ax.set(xlabel="context (tokens)", ylabel="batch")
        ax.grid(False)
        ax.set_title(MODE_LABELS[mode])
    fig.suptitle(f"{model_name(model)}: % of the roofline floor reached in decode on {device_name}", y=1.0)
    fig.tight_layout()
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="% of floor (100 = at the floor)")
    return fig


def launch_overhead(table: pd.DataFrame, device_name: str):
    """Each step's time in the engine with graphs and without, against its roofline floor (``launch_overhead`` table).

    x is the step's floor, y its measured time: the diagonal is the floor itself, and the vertical segment
    between a step's two markers is the launch overhead the graph removes.
    """
    models = _models(table) if len(table) else []
    fig, axes = _panels(max(len(models), 1), height=3.8)
    for ax, m in zip(axes, models, strict=False):  # no model: one empty panel
        t = table[table["model"] == m]
        ax.vlines(t["floor_ms"], t["graph_ms"], t["eager_ms"], color="grey", alpha=0.5, lw=1)
        for phase, marker in PHASE_MARKERS.items():
            g = t[t["phase"] == phase]
            if g.empty:
                continue
            ax.scatter(g["floor_ms"], g["eager_ms"], s=14, marker=marker, facecolors="none",
                       edgecolors=color("engine_eager"), label=f"{phase}, no graphs")  # fmt: skip
            ax.scatter(g["floor_ms"], g["graph_ms"], s=14, marker=marker, color=color("engine"),
                       label=f"{phase}, CUDA graphs")  # fmt: skip
        lim = [min(t["floor_ms"].min(), t["graph_ms"].min()) * 0.7, t["eager_ms"].max() * 1.4]
        ax.plot(lim, lim, "k--", lw=1, label="roofline floor (100%)")
        ax.plot(lim, [10 * v for v in lim], "k:", lw=0.8, label="10× the floor")
        ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="roofline floor (ms)", ylabel="measured (ms)")
        ax.set_title(model_name(m))
    fig.suptitle(f"The engine's steps on {device_name}, with and without CUDA graphs", y=1.0)
    _legend_below(fig, axes, ncol=4)
    return fig


def cost_model_fit(predicted: pd.DataFrame, device_name: str):
    """Measured against predicted step time: the per-phase models (in sample) and, where fitted, the step model
    on held-out rows (each row predicted by the fit to all the others). Markers are rasterized (hundreds of rows)."""
    panels = [("predicted_ms", "per-phase models, in sample")]
    if "heldout_ms" in predicted and predicted["heldout_ms"].notna().any():
        panels.append(("heldout_ms", "step model, held-out rows"))
    fig, axes = _panels(len(panels), height=3.8)
    for ax, (col, what) in zip(axes, panels, strict=True):
        d = predicted.dropna(subset=[col])
        for phase, marker in PHASE_MARKERS.items():
            g = d[d["phase"] == phase]
            if len(g):
                ax.scatter(g["median_ms"], g[col], s=9, marker=marker, color=PHASE_COLORS[phase], alpha=0.7,
                           label=phase, rasterized=True)  # fmt: skip
        lim = [d[["median_ms", col]].min().min() * 0.8, d[["median_ms", col]].max().max() * 1.2]
        ax.plot(lim, lim, "k--", lw=1, label="exact")
        ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured step (ms)", ylabel="cost model (ms)")
        ax.set_title(what)
    fig.suptitle(f"Cost model against measurement on {device_name} (every model and mode)", y=1.0)
    _legend_below(fig, axes, ncol=4)
    return fig


def roofline(steps: pd.DataFrame, ceilings, device_name: str):
    """Every step of one mode (the engine's, else the first timed) on the roofline: FLOP/byte against achieved
    TFLOP/s, one colour per phase and model, the run's measured copy and matmul ceilings drawn."""
    d = _ok(steps)
    if d.empty:
        return None
    mode = ROOFLINE_MODE if (d["mode"] == ROOFLINE_MODE).any() else d["mode"].iloc[0]
    d = d[d["mode"] == mode]
    points = d.assign(ms=d["median_ms"], label=d["phase"] + ", " + d["model"].map(model_name))
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    title = f"Steps on the roofline ({MODE_LABELS.get(mode, mode)}, {device_name})"
    return roofline_plot(points, ceilings.matmul_tflop_s, ceilings.copy_gb_s, title=title, ax=ax)
