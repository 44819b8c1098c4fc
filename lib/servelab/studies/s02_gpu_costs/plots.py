"""Study 2 figures: every curve against its roofline floor, the seed's values marked."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from servelab.studies.common.roofline_plot import roofline_plot
from servelab.studies.s02_gpu_costs.verdicts import SEED_DECODE_US_PER_TOKEN, SEED_PREFILL_US_PER_TOKEN

MODE_LABELS = {
    "hf_eager": "HF eager",
    "hf_cuda_graph": "HF in a CUDA graph",
    "engine": "servelab engine",
    "engine_eager": "servelab engine, no graphs",
}
PHASE_MARKERS = {"prefill": "o", "decode": "s", "mixed": "D"}


def _ok(df):
    d = df[df["status"] == "ok"].copy()
    d["mode_label"] = d["mode"].map(MODE_LABELS).fillna(d["mode"])
    return d


def prefill_cost(steps: pd.DataFrame, ceilings, device_name: str):
    """µs/token and achieved TFLOP/s against prompt length, per model and batch, with floor and ceiling."""
    d = _ok(steps)
    d = d[(d["phase"] == "prefill") & (d["context"] == 0)]  # fresh prompts; chunks after context are plotted elsewhere
    models = sorted(d["model"].unique())
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for j, m in enumerate(models):
        dm = d[d["model"] == m]
        ax = axes[0, j]
        sns.lineplot(
            data=dm,
            x="new_tokens",
            y="us_per_token",
            hue="batch",
            style="mode_label",
            marker="o",
            palette="viridis",
            ax=ax,
        )
        floor = (
            dm.assign(floor_us_per_token=dm["floor_ms"] * 1e3 / (dm["batch"] * dm["new_tokens"]))
            .groupby("new_tokens")["floor_us_per_token"]
            .min()
        )
        ax.plot(floor.index, floor.values, "k--", label="roofline floor")
        ax.axhspan(*SEED_PREFILL_US_PER_TOKEN, color="tab:red", alpha=0.12, label="RTX 2070 (seed): 30–70 µs/token")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="prompt length (tokens)",
            ylabel="prefill cost (µs/token)",
            title=f"{m}: prefill cost",
        )
        ax.legend(fontsize=7)
        ax = axes[1, j]
        sns.lineplot(
            data=dm,
            x="new_tokens",
            y="achieved_tflop_s",
            hue="batch",
            style="mode_label",
            marker="o",
            palette="viridis",
            ax=ax,
        )
        ax.axhline(ceilings.matmul_tflop_s, color="k", ls="--", label="measured bf16 matmul ceiling")
        ax.set(
            xscale="log", xlabel="prompt length (tokens)", ylabel="achieved TFLOP/s", title=f"{m}: prefill throughput"
        )
        ax.legend(fontsize=7)
    fig.suptitle(f"Prefill on {device_name}, bf16, random-initialised architecture-exact models", y=1.0)
    fig.tight_layout()
    return fig


def decode_cost(steps: pd.DataFrame, device_name: str):
    """Decode step time against context length, per batch size and mode, with the roofline floor."""
    d = _ok(steps)
    d = d[d["phase"] == "decode"]
    models = sorted(d["model"].unique())
    modes = [m for m in MODE_LABELS.values() if m in set(d["mode_label"])]
    fig, axes = plt.subplots(
        len(models), len(modes) + 1, figsize=(5 * (len(modes) + 1), 4.2 * len(models)), squeeze=False
    )
    for i, m in enumerate(models):
        dm = d[d["model"] == m]
        for j, mode in enumerate(modes):
            ax = axes[i, j]
            dd = dm[dm["mode_label"] == mode]
            sns.lineplot(
                data=dd, x="context", y="median_ms", hue="batch", marker="o", palette="viridis", ax=ax, legend=j == 0
            )
            for _, g in dd.groupby("batch"):
                g = g.sort_values("context")
                ax.errorbar(
                    g["context"],
                    g["median_ms"],
                    yerr=[g["median_ms"] - g["p25_ms"], g["p75_ms"] - g["median_ms"]],
                    fmt="none",
                    ecolor="grey",
                    alpha=0.6,
                )
            floor = dm.drop_duplicates(["batch", "context"]).sort_values("context")
            for _, g in floor.groupby("batch"):
                ax.plot(g["context"], g["floor_ms"], ":", color="k", alpha=0.5)
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="context (tokens)",
                ylabel="decode step (ms)",
                title=f"{m}: {mode}\n(dotted: roofline floor per batch)",
            )
        ax = axes[i, -1]
        one = dm[dm["batch"] == 1]
        sns.lineplot(data=one, x="context", y="us_per_token", hue="mode_label", marker="o", ax=ax)
        f1 = one.drop_duplicates("context").sort_values("context")
        ax.plot(f1["context"], f1["floor_ms"] * 1e3, "k--", label="roofline floor")
        ax.axhspan(*SEED_DECODE_US_PER_TOKEN, color="tab:red", alpha=0.12, label="RTX 2070 (seed)")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="context (tokens)",
            ylabel="µs/token",
            title=f"{m}: single-request decode",
        )
        ax.legend(fontsize=7)
    fig.suptitle(f"Decode on {device_name}, bf16; whiskers: interquartile range", y=1.0)
    fig.tight_layout()
    return fig


def pct_of_floor(steps: pd.DataFrame, device_name: str):
    """Heatmaps of % of the roofline floor reached in decode (batch × context): a row per model, a column per mode."""
    d = _ok(steps)
    d = d[d["phase"] == "decode"]
    models = sorted(d["model"].unique())
    modes = [m for m in MODE_LABELS.values() if m in set(d["mode_label"])]
    fig, axes = plt.subplots(len(models), len(modes), figsize=(4.2 * len(modes), 3.6 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        for j, mode in enumerate(modes):
            ax = axes[i, j]
            t = d[(d["model"] == m) & (d["mode_label"] == mode)].pivot_table(
                index="batch", columns="context", values="pct_of_floor"
            )
            if t.empty:
                ax.set_axis_off()
                continue
            sns.heatmap(t, annot=True, fmt=".1f", cmap="mako", vmin=0, vmax=100, cbar=False, ax=ax)
            ax.set(title=f"{m}\n{mode}", xlabel="context (tokens)", ylabel="batch")
    fig.suptitle(f"Decode: % of the roofline floor reached on {device_name} (100 = at the floor)", y=1.02)
    fig.tight_layout()
    return fig


def launch_overhead(table: pd.DataFrame, device_name: str):
    """Each step's time in the engine with graphs and without, against its roofline floor (``launch_overhead`` table).

    x is the step's floor, y its measured time: the diagonal is the floor itself, and the vertical segment
    between a step's two markers is the launch overhead the graph removes.
    """
    models = sorted(table["model"].unique())
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(6.5 * max(len(models), 1), 5.5), squeeze=False)
    for ax, m in zip(axes[0], models, strict=False):  # no model: one empty panel
        t = table[table["model"] == m]
        ax.vlines(t["floor_ms"], t["graph_ms"], t["eager_ms"], color="grey", alpha=0.5, lw=1)
        for phase, marker in PHASE_MARKERS.items():
            g = t[t["phase"] == phase]
            if g.empty:
                continue
            ax.scatter(
                g["floor_ms"],
                g["eager_ms"],
                marker=marker,
                facecolors="none",
                edgecolors="tab:red",
                label=f"{phase}: {MODE_LABELS['engine_eager']}",
            )
            ax.scatter(
                g["floor_ms"], g["graph_ms"], marker=marker, color="tab:blue", label=f"{phase}: {MODE_LABELS['engine']}"
            )
        lim = [min(t["floor_ms"].min(), t["graph_ms"].min()) * 0.7, t["eager_ms"].max() * 1.4]
        ax.plot(lim, lim, "k--", lw=1, label="roofline floor (100%)")
        ax.plot(lim, [10 * v for v in lim], "k:", lw=0.8, label="10× the floor")
        ax.set(
            xscale="log",
            yscale="log",
            xlim=lim,
            ylim=lim,
            xlabel="roofline floor of the step (ms)",
            ylabel="measured step (ms)",
            title=f"{m}: CUDA graphs against launching each kernel",
        )
        ax.legend(fontsize=7)
    fig.suptitle(f"The engine's steps on {device_name}, with and without CUDA graphs; segments: launch overhead", y=1.0)
    fig.tight_layout()
    return fig


def cost_model_fit(predicted: pd.DataFrame, title: str):
    """Measured against predicted step time: the per-phase models (in sample) and, where fitted, the step model
    on held-out rows (each row predicted by the fit to all the others)."""
    panels = [("predicted_ms", "per-phase models (in sample)")]
    if "heldout_ms" in predicted and predicted["heldout_ms"].notna().any():
        panels.append(("heldout_ms", "step model, held-out rows"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    for ax, (col, what) in zip(axes[0], panels, strict=True):
        d = predicted.dropna(subset=[col])
        sns.scatterplot(data=d, x="median_ms", y=col, hue="phase", style="mode", ax=ax)
        lim = [d[["median_ms", col]].min().min() * 0.8, d[["median_ms", col]].max().max() * 1.2]
        ax.plot(lim, lim, "k--", lw=1, label="exact")
        ax.set(
            xscale="log",
            yscale="log",
            xlim=lim,
            ylim=lim,
            xlabel="measured step (ms)",
            ylabel="cost model (ms)",
            title=f"{title}\n{what}",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


ROOFLINE_MODE = "engine"  # the engine with CUDA graphs: the mode whose steps the server runs


def roofline(steps: pd.DataFrame, ceilings, device_name: str):
    """Every step of one mode (the engine's, else the first timed) on the roofline: FLOP/byte against achieved
    TFLOP/s, one colour per phase and model, the run's measured copy and matmul ceilings drawn."""
    d = _ok(steps)
    if d.empty:
        return None
    mode = ROOFLINE_MODE if (d["mode"] == ROOFLINE_MODE).any() else d["mode"].iloc[0]
    d = d[d["mode"] == mode]
    points = d.assign(ms=d["median_ms"], label=d["phase"] + ", " + d["model"].str.split(":").str[-1])
    title = f"Steps on the roofline ({MODE_LABELS.get(mode, mode)}, {device_name})"
    return roofline_plot(points, ceilings.matmul_tflop_s, ceilings.copy_gb_s, title=title)
