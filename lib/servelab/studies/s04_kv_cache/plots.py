"""Study 4 figures: measured values beside the formula, the copy ceiling or the roofline floor, and the seed's value."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from servelab.studies.common.tested_on import model_name
from servelab.studies.s04_kv_cache.verdicts import (
    SEED_BYTES_PER_TOKEN,
    SEED_COMPACTION_GB_S,
    SEED_COMPACTION_SPEEDUP,
    SEED_DECODE_VARIATION_PCT,
    mover_name,
)

MODE_LABELS = {"hf_eager": "HF eager", "hf_cuda_graph": "HF in a CUDA graph", "engine": "servelab engine"}
WIDTH = 8.0  # inches: the book's text column
SEED_COLOR = "tab:red"


def _legend_below(fig, axes, ncol: int = 3) -> None:
    """One legend for the figure, below its panels (labels de-duplicated; panels' own legends removed)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.tight_layout()
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol)


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
    fig, ax = plt.subplots(figsize=(WIDTH, 4.0))
    sns.barplot(data=long, x="case", y="KiB/token", hue="source", ax=ax)
    ax.axhline(SEED_BYTES_PER_TOKEN / 1024, color=SEED_COLOR, ls=":", label="RTX 2070 (seed): 36 KB/token, GPT-2 fp16")
    ax.set(yscale="log", xlabel="", ylabel="KV bytes per token (KiB, log)")
    ax.set_title(f"KV cache bytes per token on {device_name}: formula vs allocated")
    ax.tick_params(axis="x", labelsize=9)
    _legend_below(fig, [ax])
    return fig


def capacity_fixed(fixed: pd.DataFrame, model: str, budget_gib: float):
    """Sequences of one fixed length that fit the budget: contiguous max-length preallocation against paged blocks."""
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    sns.barplot(data=fixed, x="length", y="sequences", hue="layout", ax=ax)
    ax.set(yscale="log", xlabel="sequence length (tokens)", ylabel="concurrent sequences (log)")
    ax.set_title(f"{model_name(model)}: sequences of one length in a {budget_gib:g} GiB budget")
    _legend_below(fig, [ax], ncol=2)
    return fig


def capacity(cap: pd.DataFrame, model: str, budget_gib: float):
    """Sampled request lengths: sequences that fit the budget (left) and the reserved slots left empty (right), per
    layout, at each request's full length and mid-decode; whiskers span the trials."""
    c = cap.assign(
        layout_label=np.where(
            cap["layout"] == "contiguous", "contiguous", "paged " + cap["block_size"].astype(int).astype(str)
        ),
        snapshot=cap["phase"].map({"complete": "full length", "mid_decode": "mid-decode"}),
    )
    order = ["contiguous"] + [
        f"paged {b}" for b in sorted(cap.loc[cap.layout == "paged", "block_size"].astype(int).unique())
    ]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.8))
    for ax, y, label in (
        (axes[0], "sequences", "concurrent sequences"),
        (axes[1], "fragmentation_pct", "reserved but empty KV slots (%)"),
    ):
        sns.barplot(data=c, x="layout_label", y=y, hue="snapshot", order=order, errorbar=("pi", 100), ax=ax)
        ax.set(xlabel="layout (paged: block size in tokens)", ylabel=label)
        ax.tick_params(axis="x", rotation=30, labelsize=9)
    fig.suptitle(f"{model_name(model)}: KV capacity of a {budget_gib:g} GiB budget, sampled request lengths", y=1.0)
    _legend_below(fig, list(axes), ncol=2)
    return fig


def _batch_palette(d: pd.DataFrame) -> dict:
    batches = sorted(d["batch"].unique())
    return dict(zip(batches, sns.color_palette("viridis", len(batches)), strict=True))


def decode_scaling(steps: pd.DataFrame, device_name: str):
    """Decode step time against context, one panel per mode (hue: batch), each batch's roofline floor dotted, and the
    seed's ±3% band around the shortest context's time."""
    d = steps[steps["status"] == "ok"]
    modes = [m for m in MODE_LABELS if m in set(d["mode"])]
    palette = _batch_palette(d)
    fig, axes = plt.subplots(1, max(len(modes), 1), figsize=(WIDTH, 3.8), squeeze=False)
    axes = list(axes[0])
    for ax, mode in zip(axes, modes, strict=True):
        dm = d[d["mode"] == mode]
        for b, g in dm.groupby("batch"):
            g = g.sort_values("context")
            ax.errorbar(g["context"], g["median_ms"], yerr=[g["median_ms"] - g["p25_ms"], g["p75_ms"] - g["median_ms"]],
                        marker="o", ms=3, color=palette[b], label=f"batch {b}", capsize=2)  # fmt: skip
            ax.plot(g["context"], g["floor_ms"], ls=":", color=palette[b])
            t0 = g["median_ms"].iloc[0]
            band = (t0 * (1 - SEED_DECODE_VARIATION_PCT / 100), t0 * (1 + SEED_DECODE_VARIATION_PCT / 100))
            ax.fill_between(g["context"], *band, color=SEED_COLOR, alpha=0.15)
        ax.set(xscale="log", yscale="log", xlabel="context (cached tokens per sequence)", ylabel="decode step (ms)")
        ax.set_title(MODE_LABELS[mode])
        _log_x_ticks(ax, d["context"])
    axes[0].plot([], [], "k:", label="roofline floor (per batch)")
    axes[0].fill_between([], [], [], color=SEED_COLOR, alpha=0.15, label="RTX 2070 (seed): ±3% over context")
    fig.suptitle(f"Decode step time against context on {device_name}", y=1.0)
    _legend_below(fig, axes, ncol=3)
    return fig


def decode_bandwidth(steps: pd.DataFrame, ceil_gb_s: float, device_name: str):
    """The bandwidth a decode step achieves (weights + KV over its time) against context, per batch and mode, beside
    the run's measured copy ceiling."""
    d = steps[steps["status"] == "ok"]
    palette = _batch_palette(d)
    styles = {"hf_eager": "-", "hf_cuda_graph": "--", "engine": "-."}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for (mode, b), g in d.groupby(["mode", "batch"]):
        g = g.sort_values("context")
        ax.plot(g["context"], g["achieved_gb_s"], marker="o", ms=3, ls=styles.get(mode, "-"), color=palette[b],
                label=f"{MODE_LABELS.get(mode, mode)}, batch {b}")  # fmt: skip
    ax.axhline(ceil_gb_s, color="k", ls="--", lw=1, label="measured copy ceiling")
    ax.set(xscale="log", yscale="log", xlabel="context (cached tokens per sequence)", ylabel="achieved GB/s")
    ax.set_title(f"Bandwidth a decode step achieves on {device_name}")
    _log_x_ticks(ax, d["context"])
    _legend_below(fig, [ax], ncol=3)
    return fig


def compaction_bandwidth(comp: pd.DataFrame, ceil_gb_s: float, device_name: str):
    """GB/s moved vs block size, per mover (hue) and pool size (style), one panel per fraction moved."""
    d = comp[comp["status"] == "ok"].copy()
    d["pool"] = d["pool_mib"].map(lambda m: f"{m / 1024:g} GiB pool" if m >= 1024 else f"{m} MiB pool")
    d["method"] = d["method"].map(mover_name)  # the movers by the section's words, as the legend shows them
    fracs = sorted(d["move_fraction"].unique())
    fig, axes = plt.subplots(1, len(fracs), figsize=(WIDTH, 3.8), squeeze=False, sharey=True)
    for ax, f in zip(axes[0], fracs, strict=True):
        sns.lineplot(
            data=d[d["move_fraction"] == f], x="block_size", y="gb_s", hue="method", style="pool", marker="o", ax=ax
        )
        ax.axhline(ceil_gb_s, color="k", ls="--", label="measured copy ceiling")
        ax.axhspan(*SEED_COMPACTION_GB_S, color=SEED_COLOR, alpha=0.15, label="RTX 2070 (seed): 19–67 GB/s")
        ax.set(xscale="log", yscale="log", xlabel="block size (tokens)", ylabel="GB/s (read + write of moved blocks)")
        ax.set_title(f"{f:.0%} of live blocks moved")
        _log_x_ticks(ax, d["block_size"])
    fig.suptitle(f"Compaction bandwidth on {device_name}", y=1.0)
    _legend_below(fig, list(axes[0]), ncol=4)
    return fig


def overlap(runs: pd.DataFrame, batch, device_name: str):
    """One decode batch's overlap experiment: each part's time per condition (median, IQR), and every round's
    compaction time with the time the seed's "30% faster" would give (the median alone over 1.3)."""
    from servelab.studies.s04_kv_cache.overlap import CONDITIONS

    runs = runs if "decode_batch" in runs else runs.assign(decode_batch=batch)
    rb = runs[runs["decode_batch"] == batch]
    order = [c for c in CONDITIONS if c in set(rb["condition"])]
    # as the table words them ("concurrent, decode prioritised"), on two lines
    labels = {c: c.replace("concurrent_prioritised", "concurrent,\ndecode prioritised").replace("_", " ")
              for c in order}  # fmt: skip
    fig, (ax_parts, ax_comp) = plt.subplots(1, 2, figsize=(WIDTH, 4.0))
    long = rb.melt(id_vars=["round", "condition"], value_vars=["compaction_ms", "decode_ms", "total_ms"],
                   var_name="part", value_name="ms").dropna()  # fmt: skip
    long["part"] = long["part"].str.replace("_ms", "")
    sns.barplot(data=long, x="condition", y="ms", hue="part", estimator="median", errorbar=("pi", 50), order=order,
                ax=ax_parts)  # fmt: skip
    ax_parts.set(xlabel="", ylabel="time (ms, median and IQR)")
    ax_parts.set_title("parts and whole")
    c = rb.dropna(subset=["compaction_ms"])
    c_order = [o for o in order if o in set(c["condition"])]
    med = c.groupby("condition")["compaction_ms"].median().reindex(c_order)
    ax_comp.scatter([c_order.index(k) for k in c["condition"]], c["compaction_ms"], s=6, alpha=0.4, color="grey",
                    rasterized=True)  # fmt: skip
    ax_comp.scatter(range(len(c_order)), med.to_numpy(), marker="_", s=400, color="k", label="median")
    if "compaction_alone" in med:
        ax_comp.axhline(med["compaction_alone"] / SEED_COMPACTION_SPEEDUP, color=SEED_COLOR, ls=":",
                        label=f"RTX 2070 (seed): {SEED_COMPACTION_SPEEDUP:g}× faster than alone")  # fmt: skip
    ax_comp.set_xticks(range(len(c_order)), [labels[k] for k in c_order])
    ax_comp.set(xlabel="", ylabel="compaction time (ms)")
    ax_comp.set_title("compaction, every round")
    for ax, o in ((ax_parts, order), (ax_comp, c_order)):
        ax.set_xticks(range(len(o)), [labels[k] for k in o], rotation=30, ha="right", fontsize=9)
    fig.suptitle(f"Compaction during decode at batch {batch} on {device_name}", y=1.0)
    _legend_below(fig, [ax_parts, ax_comp], ncol=5)
    return fig
