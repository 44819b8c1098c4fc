"""Study 5's figures: time, TFLOP/s and memory against length, decode bandwidth, masks, spreads.

Every figure draws the ceiling it is judged against (measured in the same run) and, where the seed made a numeric
claim, marks the RTX 2070's value. Each is sized for the book's column (at most 8 in wide, two panels side by side).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from servelab.studies.common.roofline_plot import roofline_plot
from servelab.studies.s05_attention.verdicts import SEED_MEMORY_GROWTH, SEED_SPEEDUP, config_label

ORDER = ["naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sdpa_default", "sdpa_repeat_kv", "flex"]
PALETTE = dict(zip(ORDER, sns.color_palette("tab10", len(ORDER)), strict=True))  # one colour per variant, every figure
SEED = "RTX 2070 (seed)"
SMALL = 9  # pt: the smallest type on a figure


def _ok(df):
    out = df[df["status"].eq("ok")].copy()
    out["config"] = [config_label(a, d) for a, d in zip(out["arch"], out["head_dim"], strict=True)]
    return out


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


def _log_lengths(ax, lengths):
    ax.set_xscale("log")
    ax.set_xticks(lengths, [f"{x // 1024}k" if x >= 1024 else str(x) for x in lengths])
    ax.minorticks_off()


def prefill_time(prefill: pd.DataFrame, roof):
    """Median time against length per variant, one panel per configuration, with the roofline floor."""
    ok = _ok(prefill)
    configs = sorted(ok["config"].unique())
    lengths = sorted(int(x) for x in ok["q_len"].unique())
    fig, axes = _grid(len(configs))
    for ax, cfg in zip(axes, configs, strict=True):
        g = ok[ok["config"] == cfg]
        for v in _hue_order(ok):
            gv = g[g["variant"] == v].sort_values("q_len")
            if len(gv):
                ax.plot(gv["q_len"], gv["median_ms"], "o-", ms=3, color=PALETTE[v], label=v)
        fl = g.drop_duplicates("q_len").sort_values("q_len")
        ax.plot(fl["q_len"], roof.floor_ms(fl["flops"], fl["min_bytes"]), "k--", lw=1, label="roofline floor")
        ax.set(yscale="log", title=cfg, xlabel="sequence length (tokens)", ylabel="time per call (ms)")
        _log_lengths(ax, lengths)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def prefill_tflops(prefill: pd.DataFrame, ceilings):
    """Achieved TFLOP/s (causal half counted) against length, with the measured matmul ceiling."""
    ok = _ok(prefill)
    configs = sorted(ok["config"].unique())
    lengths = sorted(int(x) for x in ok["q_len"].unique())
    fig, axes = _grid(len(configs))
    for ax, cfg in zip(axes, configs, strict=True):
        g = ok[ok["config"] == cfg]
        for v in _hue_order(ok):
            gv = g[g["variant"] == v].sort_values("q_len")
            if len(gv):
                ax.plot(gv["q_len"], gv["achieved_tflop_s"], "o-", ms=3, color=PALETTE[v], label=v)
        ax.axhline(ceilings.matmul_tflop_s, color="k", ls="--", lw=1, label=f"{ceilings.matmul_dtype} matmul ceiling")
        ax.set(yscale="log", title=cfg, xlabel="sequence length (tokens)", ylabel="achieved TFLOP/s")
        _log_lengths(ax, lengths)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def speedup(speedups: pd.DataFrame, seed_length: int):
    """naive / SDPA-default time against length, with the RTX 2070's 7.64× at 2,048 tokens marked."""
    sp = speedups.copy()
    sp["config"] = [config_label(a, d) for a, d in zip(sp["arch"], sp["head_dim"], strict=True)]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for cfg, g in sp.groupby("config", sort=True):
        g = g.sort_values("q_len")
        ax.plot(g["q_len"], g["speedup"], "o-", ms=4, label=cfg)
    ax.plot([seed_length], [SEED_SPEEDUP], marker="*", ms=16, color="crimson", ls="none",
            label=f"{SEED}: {SEED_SPEEDUP}× at {seed_length:,}")  # fmt: skip
    ax.axhline(SEED_SPEEDUP, color="crimson", lw=0.8, ls=":")
    ax.set(yscale="log", xlabel="sequence length (tokens)", ylabel="naive time / SDPA default time (×)")
    _log_lengths(ax, sorted(int(x) for x in sp["q_len"].unique()))
    ax.legend(fontsize=SMALL)
    fig.tight_layout()
    return fig


def memory(prefill: pd.DataFrame, device_memory_bytes: float | None):
    """Peak memory of one call (Q/K/V included) against length, with the device's memory; OOMs marked."""
    ok = _ok(prefill)
    configs = sorted(ok["config"].unique())
    lengths = sorted(int(x) for x in prefill["q_len"].unique())
    oom = prefill[prefill["status"].isin(["oom"])].copy()
    oom["config"] = [config_label(a, d) for a, d in zip(oom["arch"], oom["head_dim"], strict=True)]
    fig, axes = _grid(len(configs))
    for ax, cfg in zip(axes, configs, strict=True):
        g = ok[ok["config"] == cfg]
        for v in _hue_order(ok):
            gv = g[g["variant"] == v].sort_values("q_len")
            if len(gv):
                ax.plot(gv["q_len"], gv["peak_mem_incl_inputs_bytes"] / 1e9, "o-", ms=3, color=PALETTE[v], label=v)
        if device_memory_bytes:
            ax.axhline(device_memory_bytes / 1e9, color="k", ls="--", lw=1, label="device memory")
            bad = oom[oom["config"] == cfg]
            if len(bad):
                ax.plot(bad["q_len"], [device_memory_bytes / 1e9] * len(bad), "rx", ms=8, label="out of memory")
        ax.set(yscale="log", title=cfg, xlabel="sequence length (tokens)", ylabel="peak memory (GB)")
        _log_lengths(ax, lengths)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def memory_growth_bars(growth: pd.DataFrame):
    """Peak-memory growth for 32× longer sequences per variant, with the RTX 2070's 25× and 2.4×."""
    g = growth.copy()
    g["config"] = [config_label(a, d) for a, d in zip(g["arch"], g["head_dim"], strict=True)]
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
    lengths = sorted(int(x) for x in ok["kv_len"].unique())
    fig, axes = _grid(len(batches), row_height=2.8)
    for ax, b in zip(axes, batches, strict=True):
        g = ok[ok["batch"].eq(b)]
        for v in _hue_order(ok):
            gv = g[g["variant"] == v].sort_values("kv_len")
            if len(gv):
                ax.plot(gv["kv_len"], gv["achieved_gb_s"], "o-", ms=3, color=PALETTE[v], label=v)
        ax.axhline(ceilings.copy_gb_s, color="k", ls="--", lw=1, label="copy ceiling")
        ax.set(yscale="log", title=f"batch {b}", xlabel="KV length (tokens)", ylabel="K+V read (GB/s)")
        _log_lengths(ax, lengths)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def masks(mask_df: pd.DataFrame, roof):
    """Masked prefill time per mask: SDPA with a dense mask (or is_causal) against Flex's block mask, with each
    mask's own roofline floor (only allowed pairs counted)."""
    ok = _ok(mask_df)
    kinds = list(dict.fromkeys(ok["mask"]))
    lengths = sorted(int(x) for x in ok["q_len"].unique())
    fig, axes = _grid(len(kinds), row_height=2.9)
    for ax, kind in zip(axes, kinds, strict=True):
        g = ok[ok["mask"] == kind]
        for v in _hue_order(ok):
            gv = g[g["variant"] == v].sort_values("q_len")
            if len(gv):
                ax.plot(gv["q_len"], gv["median_ms"], "o-", ms=4, color=PALETTE[v], label=v)
        fl = mask_df[mask_df["mask"] == kind].drop_duplicates("q_len").sort_values("q_len")
        ax.plot(fl["q_len"], roof.floor_ms(fl["flops"], fl["min_bytes"]), "k--", lw=1, label="roofline floor")
        ax.set(yscale="log", title=f"{kind.replace('_', ' ')} mask", xlabel="sequence length (tokens)",
               ylabel="time per call (ms)")  # fmt: skip
        _log_lengths(ax, lengths)
    _legend_below(fig, axes)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


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
