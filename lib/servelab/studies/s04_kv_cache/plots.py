"""Study 4 figures: measured values beside the formula, the copy ceiling or the roofline floor, and the seed's value."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from servelab.studies.s04_kv_cache.verdicts import SEED_BYTES_PER_TOKEN, SEED_COMPACTION_GB_S, SEED_DECODE_VARIATION_PCT

MODE_LABELS = {"hf_eager": "HF eager", "hf_cuda_graph": "HF in a CUDA graph", "engine": "servelab engine"}


def _log_x_ticks(ax, values) -> None:
    """Label a log x axis at exactly the values swept (matplotlib's minor labels collide otherwise)."""
    values = sorted({int(v) for v in values})
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticklabels([f"{v:,}" for v in values])


def bytes_per_token(bpt: pd.DataFrame, device_name: str):
    """KiB/token per architecture: formula, HF cache tensors, HF storages, paged pool (log scale)."""
    ok = bpt[bpt["status"] == "ok"].copy()
    ok["case"] = ok["model"].str.replace("config:", "") + "\n" + ok["attention"] + ", " + ok["dtype"]
    cols = {
        "formula_bytes": "formula",
        "hf_bytes_per_token": "HF cache tensors",
        "hf_storage_bytes_per_token": "HF cache storages",
        "pool_bytes_per_token": "paged pool (storage)",
        "pool_allocator_bytes_per_token": "paged pool (allocator)",
    }
    long = ok.melt(id_vars="case", value_vars=[c for c in cols if c in ok], var_name="source", value_name="bytes")
    long = long.dropna(subset=["bytes"])
    long["KiB/token"] = long["bytes"] / 1024
    long["source"] = long["source"].map(cols)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(ok)), 4.2))
    sns.barplot(data=long, x="case", y="KiB/token", hue="source", ax=ax)
    ax.axhline(SEED_BYTES_PER_TOKEN / 1024, color="tab:red", ls=":", label="RTX 2070 (seed): 36 KB/token")
    ax.set(
        yscale="log",
        xlabel="",
        ylabel="KV bytes per token (KiB, log)",
        title=f"KV cache bytes per token on {device_name}: formula vs allocated",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def capacity(cap: pd.DataFrame, fixed: pd.DataFrame, model: str, budget_gib: float, source: str):
    """Left: sequences that fit a fixed length; middle/right: sampled lengths, sequences and fragmentation %."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.3))
    sns.barplot(data=fixed, x="length", y="sequences", hue="layout", ax=axes[0])
    axes[0].set(
        yscale="log", xlabel="sequence length (tokens)", ylabel="concurrent sequences (log)", title="fixed length"
    )
    c = cap.assign(
        layout_label=np.where(
            cap["layout"] == "contiguous",
            "contiguous (max length)",
            "paged, " + cap["block_size"].astype(str) + "-token blocks",
        )
    )
    order = ["contiguous (max length)"] + [
        f"paged, {b}-token blocks" for b in sorted(cap.loc[cap.layout == "paged", "block_size"].unique())
    ]
    sns.barplot(data=c, x="layout_label", y="sequences", hue="phase", order=order, errorbar=("pi", 100), ax=axes[1])
    axes[1].set(xlabel="", ylabel="concurrent sequences", title="sampled lengths: sequences that fit")
    sns.barplot(
        data=c, x="layout_label", y="fragmentation_pct", hue="phase", order=order, errorbar=("pi", 100), ax=axes[2]
    )
    axes[2].set(xlabel="", ylabel="reserved but unused KV slots (%)", title="sampled lengths: fragmentation")
    for ax in axes[1:]:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(f"{model}: KV capacity of a {budget_gib:g} GiB budget\nLengths: {source}", fontsize=10)
    fig.tight_layout()
    return fig


def decode_scaling(steps: pd.DataFrame, ceil_gb_s: float, device_name: str):
    """Step time vs context per mode (hue: batch), floors dotted, the seed's ±3% band around the shortest context;
    right: achieved GB/s vs context with the copy ceiling."""
    d = steps[steps["status"] == "ok"].copy()
    d["mode_label"] = d["mode"].map(MODE_LABELS).fillna(d["mode"])
    modes = [m for m in MODE_LABELS.values() if m in set(d["mode_label"])]
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(5.2 * (len(modes) + 1), 4.3), squeeze=False)
    axes = axes[0]
    palette = dict(zip(sorted(d["batch"].unique()), sns.color_palette("viridis", d["batch"].nunique()), strict=True))
    for ax, mode in zip(axes, modes, strict=False):  # the last axis is the GB/s panel
        dm = d[d["mode_label"] == mode]
        for b, g in dm.groupby("batch"):
            g = g.sort_values("context")
            ax.errorbar(
                g["context"],
                g["median_ms"],
                yerr=[g["median_ms"] - g["p25_ms"], g["p75_ms"] - g["median_ms"]],
                marker="o",
                color=palette[b],
                label=f"batch {b}",
                capsize=2,
            )
            ax.plot(g["context"], g["floor_ms"], ls=":", color=palette[b])
            t0 = g["median_ms"].iloc[0]
            ax.fill_between(
                g["context"],
                t0 * (1 - SEED_DECODE_VARIATION_PCT / 100),
                t0 * (1 + SEED_DECODE_VARIATION_PCT / 100),
                color=palette[b],
                alpha=0.12,
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="context (cached tokens per sequence)",
            ylabel="decode step (ms)",
            title=f"{mode}\n(dotted: roofline floor; band: seed's ±3%)",
        )
        _log_x_ticks(ax, d["context"])
        ax.legend(fontsize=7)
    ax = axes[-1]
    sns.lineplot(
        data=d, x="context", y="achieved_gb_s", hue="batch", style="mode_label", marker="o", palette=palette, ax=ax
    )
    ax.axhline(ceil_gb_s, color="k", ls="--", label="measured copy ceiling")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context (cached tokens per sequence)",
        ylabel="achieved GB/s (weights + KV per step)",
        title="bandwidth achieved by a decode step",
    )
    _log_x_ticks(ax, d["context"])
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle(f"Decode step time against context on {device_name}", y=1.02)
    fig.tight_layout()
    return fig


def compaction_bandwidth(comp: pd.DataFrame, ceil_gb_s: float, device_name: str):
    """GB/s moved vs block size, per mover (hue) and pool size (style), one panel per fraction moved."""
    d = comp[comp["status"] == "ok"].copy()
    d["pool"] = d["pool_mib"].map(lambda m: f"{m / 1024:g} GiB pool" if m >= 1024 else f"{m} MiB pool")
    fracs = sorted(d["move_fraction"].unique())
    fig, axes = plt.subplots(1, len(fracs), figsize=(5.2 * len(fracs) + 2, 4.3), squeeze=False, sharey=True)
    for i, (ax, f) in enumerate(zip(axes[0], fracs, strict=True)):
        sns.lineplot(
            data=d[d["move_fraction"] == f], x="block_size", y="gb_s", hue="method", style="pool", marker="o", ax=ax
        )
        ax.axhline(ceil_gb_s, color="k", ls="--", label="measured copy ceiling")
        ax.axhspan(*SEED_COMPACTION_GB_S, color="tab:red", alpha=0.15, label="RTX 2070 (seed): 19–67 GB/s")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="block size (tokens)",
            ylabel="GB/s (read + write of moved blocks)",
            title=f"{f:.0%} of live blocks moved",
        )
        _log_x_ticks(ax, d["block_size"])
        if i == len(fracs) - 1:
            ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        else:
            ax.get_legend().remove()
    fig.suptitle(f"Compaction bandwidth on {device_name}", y=1.02)
    fig.tight_layout()
    return fig


def overlap(runs: pd.DataFrame, device_name: str):
    """Per decode batch: each part's time per condition (median, IQR), and every round's compaction time."""
    from servelab.studies.s04_kv_cache.overlap import CONDITIONS

    runs = runs if "decode_batch" in runs else runs.assign(decode_batch=0)
    batches = sorted(runs["decode_batch"].unique())
    order = [c for c in CONDITIONS if c in set(runs["condition"])]
    fig, axes = plt.subplots(len(batches), 2, figsize=(12, 4.2 * len(batches)), squeeze=False)
    for (ax_parts, ax_comp), b in zip(axes, batches, strict=True):
        rb = runs[runs["decode_batch"] == b]
        long = rb.melt(
            id_vars=["round", "condition"],
            value_vars=["compaction_ms", "decode_ms", "total_ms"],
            var_name="part",
            value_name="ms",
        ).dropna()
        long["part"] = long["part"].str.replace("_ms", "")
        sns.barplot(
            data=long,
            x="condition",
            y="ms",
            hue="part",
            estimator="median",
            errorbar=("pi", 50),
            order=order,
            ax=ax_parts,
        )
        ax_parts.set(xlabel="", ylabel="time (ms, median and IQR)", title=f"decode batch {b}: parts and whole")
        ax_parts.tick_params(axis="x", rotation=15)
        c = rb.dropna(subset=["compaction_ms"])
        c_order = [o for o in order if o in set(c["condition"])]
        sns.stripplot(data=c, x="condition", y="compaction_ms", order=c_order, ax=ax_comp, alpha=0.6)
        sns.pointplot(
            data=c,
            x="condition",
            y="compaction_ms",
            order=c_order,
            estimator="median",
            errorbar=None,
            color="k",
            linestyles="none",
            markers="_",
            markersize=20,
            ax=ax_comp,
        )
        ax_comp.set(
            xlabel="",
            ylabel="compaction time (ms)",
            title=f"decode batch {b}: compaction time, every round (black: median)",
        )
        ax_comp.tick_params(axis="x", rotation=15)
    fig.suptitle(f"Compaction during decode on {device_name}", y=1.01)
    fig.tight_layout()
    return fig
