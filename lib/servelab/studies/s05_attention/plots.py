"""Study 5's figures: time, TFLOP/s and memory against length, decode bandwidth, masks, spreads.

Every figure draws the ceiling it is judged against (measured in the same run) and, where the seed made a numeric
claim, marks the RTX 2070's value. Each is sized for the book's column (at most 8 in wide, two panels side by side).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from servelab.studies.common.roofline_plot import roofline_plot
from servelab.studies.s05_attention.verdicts import SEED_MEMORY_GROWTH, SEED_SPEEDUP, with_config

ORDER = ["naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sdpa_default", "sdpa_repeat_kv", "flex"]
PALETTE = dict(zip(ORDER, sns.color_palette("tab10", len(ORDER)), strict=True))  # one colour per variant, every figure
SEED = "RTX 2070 (seed)"
SMALL = 9  # pt: the smallest type on a figure


def _ok(df):
    return with_config(df[df["status"].eq("ok")])


def _hue_order(df):
    return [v for v in ORDER if v in set(df["variant"])]


def _grid(n: int, width: float = 8.0, row_height: float = 3.1):
    """Panels two to a row, the figure at most ``width`` inches wide."""
    cols = min(2, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, row_height * rows + 0.9), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend_below(fig, axes, ncol: int = 4):
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=ncol, fontsize=SMALL, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # the legend's strip below the panels
    return fig


def _log_lengths(ax, values):
    lengths = sorted(int(x) for x in values.unique())
    ax.set_xscale("log")
    ax.set_xticks(lengths, [f"{x // 1024}k" if x >= 1024 else str(x) for x in lengths])
    ax.minorticks_off()


def _variant_lines(ax, rows, variants, x: str, y: str, ms: int = 3):
    """One line per variant of ``variants`` (the figure's order) that has points in ``rows``."""
    for v in variants:
        gv = rows[rows["variant"] == v].sort_values(x)
        if len(gv):
            ax.plot(gv[x], gv[y], "o-", ms=ms, color=PALETTE[v], label=v)


def _roofline_floor(ax, rows, roof):
    fl = rows.drop_duplicates("q_len").sort_values("q_len")
    ax.plot(fl["q_len"], roof.floor_ms(fl["flops"], fl["min_bytes"]), "k--", lw=1, label="roofline floor")


def _per_config(ok: pd.DataFrame, y: str, ylabel: str, lengths: pd.Series, reference):
    """``y`` against prefill length, one line per variant, one panel per configuration, each panel with what
    ``reference(ax, config, rows)`` draws to judge it against; x ticks at ``lengths``."""
    configs = sorted(ok["config"].unique())
    fig, axes = _grid(len(configs))
    for ax, cfg in zip(axes, configs, strict=True):
        g = ok[ok["config"] == cfg]
        _variant_lines(ax, g, _hue_order(ok), "q_len", y)
        reference(ax, cfg, g)
        ax.set(yscale="log", title=cfg, xlabel="sequence length (tokens)", ylabel=ylabel)
        _log_lengths(ax, lengths)
    return _legend_below(fig, axes)


def prefill_time(prefill: pd.DataFrame, roof):
    """Median time against length per variant, one panel per configuration, with the roofline floor."""
    ok = _ok(prefill)
    return _per_config(
        ok, "median_ms", "time per call (ms)", ok["q_len"], lambda ax, cfg, g: _roofline_floor(ax, g, roof)
    )


def prefill_tflops(prefill: pd.DataFrame, ceilings):
    """Achieved TFLOP/s (causal half counted) against length, with the measured matmul ceiling."""

    def ceiling(ax, cfg, g):
        ax.axhline(ceilings.matmul_tflop_s, color="k", ls="--", lw=1, label=f"{ceilings.matmul_dtype} matmul ceiling")

    ok = _ok(prefill)
    return _per_config(ok, "achieved_tflop_s", "achieved TFLOP/s", ok["q_len"], ceiling)


def speedup(speedups: pd.DataFrame, seed_length: int):
    """naive / SDPA-default time against length, with the RTX 2070's 7.64× at 2,048 tokens marked."""
    sp = with_config(speedups)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for cfg, g in sp.groupby("config", sort=True):
        g = g.sort_values("q_len")
        ax.plot(g["q_len"], g["speedup"], "o-", ms=4, label=cfg)
    ax.plot([seed_length], [SEED_SPEEDUP], marker="*", ms=16, color="crimson", ls="none",
            label=f"{SEED}: {SEED_SPEEDUP}× at {seed_length:,}")  # fmt: skip
    ax.axhline(SEED_SPEEDUP, color="crimson", lw=0.8, ls=":")
    ax.set(yscale="log", xlabel="sequence length (tokens)", ylabel="naive time / SDPA default time (×)")
    _log_lengths(ax, sp["q_len"])
    ax.legend(fontsize=SMALL)
    fig.tight_layout()
    return fig


def memory(prefill: pd.DataFrame, device_memory_bytes: float | None):
    """Peak memory of one call (Q/K/V included) against length, with the device's memory; OOMs marked."""
    oom = with_config(prefill[prefill["status"].isin(["oom"])])

    def device_memory(ax, cfg, g):
        if device_memory_bytes:
            ax.axhline(device_memory_bytes / 1e9, color="k", ls="--", lw=1, label="device memory")
            bad = oom[oom["config"] == cfg]
            if len(bad):
                ax.plot(bad["q_len"], [device_memory_bytes / 1e9] * len(bad), "rx", ms=8, label="out of memory")

    ok = _ok(prefill)
    ok = ok.assign(peak_gb=ok["peak_mem_incl_inputs_bytes"] / 1e9)
    # every length swept, those that ran out of memory included
    return _per_config(ok, "peak_gb", "peak memory (GB)", prefill["q_len"], device_memory)


def memory_growth_bars(growth: pd.DataFrame):
    """Peak-memory growth for 32× longer sequences per variant, with the RTX 2070's 25× and 2.4×."""
    g = with_config(growth)
    pairs = list(dict.fromkeys(zip(g["short"], g["long"], strict=True)))
    order = _hue_order(g)
    fig, axes = plt.subplots(1, len(pairs), figsize=(8, 4.2), sharey=True, squeeze=False)
    for ax, (short, long) in zip(axes[0], pairs, strict=True):
        d = g[g["short"].eq(short) & g["long"].eq(long)]
        sns.barplot(data=d, x="variant", y="growth_incl_inputs", hue="config", order=order, ax=ax)
        seeds = [(i, SEED_MEMORY_GROWTH[v]) for i, v in enumerate(order) if v in SEED_MEMORY_GROWTH]
        ax.plot([i for i, _ in seeds], [s for _, s in seeds], marker="*", ms=14, color="crimson", ls="none",
                label=SEED)  # fmt: skip
        ax.set(yscale="log", xlabel="", ylabel="peak memory growth (×)", title=f"{short:,} → {long:,} tokens")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=SMALL)
    fig.tight_layout()
    return fig


def decode_bandwidth(decode: pd.DataFrame, ceilings, arch: str):
    """Achieved K+V GB/s against KV length per variant for one model's heads, one panel per batch size, with the
    measured copy ceiling."""
    ok = _ok(decode)
    ok = ok[ok["arch"].eq(arch)]
    batches = sorted(int(b) for b in ok["batch"].unique())
    fig, axes = _grid(len(batches), row_height=2.8)
    for ax, b in zip(axes, batches, strict=True):
        _variant_lines(ax, ok[ok["batch"].eq(b)], _hue_order(ok), "kv_len", "achieved_gb_s")
        ax.axhline(ceilings.copy_gb_s, color="k", ls="--", lw=1, label="copy ceiling")
        ax.set(yscale="log", title=f"batch {b}", xlabel="KV length (tokens)", ylabel="K+V read (GB/s)")
        _log_lengths(ax, ok["kv_len"])
    return _legend_below(fig, axes)


def masks(mask_df: pd.DataFrame, roof):
    """Masked prefill time per mask: SDPA with a dense mask (or is_causal) against Flex's block mask, with each
    mask's own roofline floor (only allowed pairs counted)."""
    ok = _ok(mask_df)
    kinds = list(dict.fromkeys(ok["mask"]))
    fig, axes = _grid(len(kinds), row_height=2.9)
    for ax, kind in zip(axes, kinds, strict=True):
        _variant_lines(ax, ok[ok["mask"] == kind], _hue_order(ok), "q_len", "median_ms", ms=4)
        _roofline_floor(ax, mask_df[mask_df["mask"] == kind], roof)
        ax.set(yscale="log", title=f"{kind.replace('_', ' ')} mask", xlabel="sequence length (tokens)",
               ylabel="time per call (ms)")  # fmt: skip
        _log_lengths(ax, ok["q_len"])
    return _legend_below(fig, axes)


def spread(spread_df: pd.DataFrame, regime: str):
    """F5.3 in one regime: slowest/fastest time across kernels (per architecture) and across architectures (per
    kernel)."""
    d = spread_df[spread_df["regime"] == regime]
    d = d.assign(label=[f"{c.split(',')[0]}: {f}" for c, f in zip(d["comparison"], d["fixed"], strict=True)])
    fig, ax = plt.subplots(figsize=(7.5, 0.4 * len(d) + 1.6))
    sns.barplot(data=d, y="label", x="spread", hue="comparison", dodge=False, ax=ax)
    ax.set(xscale="log", xlim=(1, None), xlabel="slowest / fastest time (×)", ylabel="")
    ax.legend(fontsize=SMALL)
    fig.tight_layout()
    return fig


def roofline(prefill: pd.DataFrame, decode: pd.DataFrame, ceilings, device_name: str):
    """Every timed prefill and decode call on the roofline: FLOP/byte (the shape's minimum bytes) against achieved
    TFLOP/s, one colour per kernel, the run's measured copy and matmul ceilings drawn."""
    d = pd.concat([_ok(prefill), _ok(decode)], ignore_index=True)
    if d.empty:
        return None
    points = d.assign(ms=d["median_ms"], bytes=d["min_bytes"], label=d["variant"])
    title = f"Attention kernels on the roofline ({device_name})"
    return roofline_plot(points, ceilings.matmul_tflop_s, ceilings.copy_gb_s, title=title)
