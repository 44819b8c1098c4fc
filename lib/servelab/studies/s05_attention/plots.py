"""Study 5's figures: time, TFLOP/s and memory against length, decode bandwidth, masks, spreads.

Every figure draws the ceiling it is judged against (measured in the same run) and, where the seed
made a numeric claim, marks the RTX 2070's value.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from servelab.studies.common.roofline_plot import roofline_plot
from servelab.studies.s05_attention.verdicts import SEED_MEMORY_GROWTH, SEED_SPEEDUP, config_label

ORDER = ["naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sdpa_default", "sdpa_repeat_kv", "flex"]
PALETTE = dict(zip(ORDER, sns.color_palette("tab10", len(ORDER)), strict=True))  # one colour per variant, every figure


def _ok(df):
    out = df[df["status"].eq("ok")].copy()
    out["config"] = [config_label(a, d) for a, d in zip(out["arch"], out["head_dim"], strict=True)]
    return out


def _hue_order(df):
    return [v for v in ORDER if v in set(df["variant"])]


def _errorbars(ax, g, x, y="median_ms", lo="p25_ms", hi="p75_ms", color=None):
    ax.errorbar(g[x], g[y], yerr=[g[y] - g[lo], g[hi] - g[y]], fmt="none", ecolor=color, alpha=0.6, lw=1)


def prefill_time(prefill: pd.DataFrame, roof):
    """Median time (IQR bars) against length per variant, one panel per configuration, with the
    roofline floor from the measured ceilings."""
    ok = _ok(prefill)
    order = _hue_order(ok)
    pal = PALETTE
    configs = sorted(ok["config"].unique())
    fig, axes = plt.subplots(1, len(configs), figsize=(4.2 * len(configs), 3.8), sharey=True, squeeze=False)
    for ax, cfg in zip(axes[0], configs, strict=True):
        g = ok[ok["config"] == cfg]
        for v in order:
            gv = g[g["variant"] == v].sort_values("q_len")
            if len(gv):
                ax.plot(gv["q_len"], gv["median_ms"], "o-", ms=3, color=pal[v], label=v)
                _errorbars(ax, gv, "q_len", color=pal[v])
        fl = g.drop_duplicates("q_len").sort_values("q_len")
        ax.plot(fl["q_len"], roof.floor_ms(fl["flops"], fl["min_bytes"]), "k--", lw=1, label="roofline floor")
        ax.set(xscale="log", yscale="log", title=cfg, xlabel="sequence length (tokens)")
        ax.set_xticks(
            sorted(ok["q_len"].unique()), [f"{x:,}" for x in sorted(ok["q_len"].unique())], rotation=60, fontsize=7
        )
    axes[0][0].set_ylabel("time per call (ms, median, IQR)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("Causal prefill attention, batch 1")
    fig.tight_layout()
    return fig


def prefill_tflops(prefill: pd.DataFrame, ceilings):
    """Achieved TFLOP/s (causal half counted) against length, with the measured matmul ceiling."""
    ok = _ok(prefill)
    g = sns.relplot(
        data=ok,
        x="q_len",
        y="achieved_tflop_s",
        hue="variant",
        hue_order=_hue_order(ok),
        palette=PALETTE,
        col="config",
        kind="line",
        marker="o",
        height=3.4,
        aspect=1.0,
        facet_kws=dict(sharey=True),
    )
    for ax in g.axes.flat:
        ax.axhline(ceilings.matmul_tflop_s, color="k", ls="--", lw=1)
        ax.text(ok["q_len"].min(), ceilings.matmul_tflop_s * 1.1, f"{ceilings.matmul_dtype} matmul ceiling", fontsize=7)
        ax.set(xscale="log", yscale="log")
    g.set_titles("{col_name}")
    g.set_axis_labels("sequence length (tokens)", "achieved TFLOP/s")
    g.fig.suptitle("Attention FLOP rate against the measured matmul ceiling", y=1.03)
    return g.fig


def speedup(prefill: pd.DataFrame, speedups: pd.DataFrame, seed_length: int):
    """naive / SDPA-default time against length, with the RTX 2070's 7.64× at 2,048 tokens marked."""
    sp = speedups.copy()
    sp["config"] = [config_label(a, d) for a, d in zip(sp["arch"], sp["head_dim"], strict=True)]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    sns.lineplot(data=sp, x="q_len", y="speedup", hue="config", marker="o", ax=ax)
    ax.plot(
        [seed_length],
        [SEED_SPEEDUP],
        marker="*",
        ms=14,
        color="crimson",
        ls="none",
        label=f"RTX 2070 (seed): {SEED_SPEEDUP}× at {seed_length:,}",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length (tokens)",
        ylabel="naive time / SDPA default time (×)",
        title="How much faster SDPA's default is than naive attention",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def memory(prefill: pd.DataFrame, device_memory_bytes: float | None):
    """Peak memory of one call (Q/K/V included) against length, with the device's memory; OOMs marked."""
    ok = _ok(prefill)
    g = sns.relplot(
        data=ok,
        x="q_len",
        y="peak_mem_incl_inputs_bytes",
        hue="variant",
        hue_order=_hue_order(ok),
        palette=PALETTE,
        col="config",
        kind="line",
        marker="o",
        height=3.4,
        aspect=1.0,
    )
    oom = prefill[prefill["status"].isin(["oom"])].copy()
    oom["config"] = [config_label(a, d) for a, d in zip(oom["arch"], oom["head_dim"], strict=True)]
    for cfg, ax in g.axes_dict.items():
        if device_memory_bytes:
            ax.axhline(device_memory_bytes, color="k", ls="--", lw=1)
            ax.text(ok["q_len"].min(), device_memory_bytes * 1.15, "device memory", fontsize=7)
            for _, r in oom[oom["config"] == cfg].iterrows():
                ax.plot(r["q_len"], device_memory_bytes, "rx", ms=8)
                ax.annotate(
                    f"{r['variant']}: OOM",
                    (r["q_len"], device_memory_bytes),
                    fontsize=6,
                    textcoords="offset points",
                    xytext=(-40, 8),
                )
        ax.set(xscale="log", yscale="log")
    g.set_titles("{col_name}")
    g.set_axis_labels("sequence length (tokens)", "peak memory of one call (bytes, Q/K/V incl.)")
    g.fig.suptitle("Peak memory against length (max_memory_allocated)", y=1.03)
    return g.fig


def memory_growth_bars(growth: pd.DataFrame):
    """Peak-memory growth for 32× longer sequences per variant, with the RTX 2070's 25× and 2.4×."""
    g = growth.copy()
    g["config"] = [config_label(a, d) for a, d in zip(g["arch"], g["head_dim"], strict=True)]
    g["pair"] = [f"{s:,}→{lo:,}" for s, lo in zip(g["short"], g["long"], strict=True)]
    cat = sns.catplot(
        data=g,
        x="variant",
        y="growth_incl_inputs",
        hue="config",
        col="pair",
        kind="bar",
        order=_hue_order(g),
        height=3.4,
        aspect=1.4,
    )
    for ax in cat.axes.flat:
        for i, v in enumerate(_hue_order(g)):
            if v in SEED_MEMORY_GROWTH:
                ax.plot([i], [SEED_MEMORY_GROWTH[v]], marker="*", ms=12, color="crimson", ls="none")
        ax.set(yscale="log")
        ax.tick_params(axis="x", rotation=45)
    cat.set_axis_labels("", "peak memory growth (×, for 32× tokens)")
    cat.fig.suptitle("Memory growth for 32× longer sequences; red stars: the RTX 2070's (seed)", y=1.03)
    return cat.fig


def decode_bandwidth(decode: pd.DataFrame, ceilings):
    """Achieved K+V GB/s against KV length per variant, one panel per (model, batch), copy ceiling drawn."""
    ok = _ok(decode)
    g = sns.relplot(
        data=ok,
        x="kv_len",
        y="achieved_gb_s",
        hue="variant",
        hue_order=_hue_order(ok),
        palette=PALETTE,
        row="arch",
        col="batch",
        kind="line",
        marker="o",
        height=2.6,
        aspect=1.0,
    )
    for ax in g.axes.flat:
        ax.axhline(ceilings.copy_gb_s, color="k", ls="--", lw=1)
        ax.set(xscale="log", yscale="log")
    g.set_titles("{row_name}, batch {col_name}", size=8)
    g.set_axis_labels("KV length (tokens)", "K+V read (GB/s)")
    g.fig.suptitle("Decode attention: one query token per sequence, against the measured copy ceiling (dashed)", y=1.02)
    return g.fig


def masks(mask_df: pd.DataFrame, roof):
    """Masked prefill time per mask: SDPA with a dense mask (or is_causal) against Flex's block mask,
    with each mask's own roofline floor (only allowed pairs counted)."""
    ok = _ok(mask_df)
    g = sns.relplot(
        data=ok,
        x="q_len",
        y="median_ms",
        hue="variant",
        hue_order=_hue_order(ok),
        palette=PALETTE,
        col="mask",
        kind="line",
        marker="o",
        height=3.2,
        aspect=1.0,
    )
    for kind, ax in g.axes_dict.items():
        fl = mask_df[mask_df["mask"] == kind].drop_duplicates("q_len").sort_values("q_len")
        ax.plot(fl["q_len"], roof.floor_ms(fl["flops"], fl["min_bytes"]), "k--", lw=1)
        ax.set(xscale="log", yscale="log")
    g.set_titles("{col_name} mask")
    g.set_axis_labels("sequence length (tokens)", "time per call (ms)")
    g.fig.suptitle("Masks: dense SDPA mask against FlexAttention's block mask (dashed: roofline floor)", y=1.03)
    return g.fig


def spread(spread_df: pd.DataFrame):
    """F5.3: slowest/fastest time across kernels (per architecture) and across architectures (per kernel),
    one panel per regime (prefill, decode)."""
    regimes = list(dict.fromkeys(spread_df["regime"]))
    n = spread_df.groupby("regime").size().max()
    fig, axes = plt.subplots(1, len(regimes), figsize=(6.5 * len(regimes), 0.35 * n + 1.4), squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=True):
        d = spread_df[spread_df["regime"] == regime]
        d = d.assign(label=[f"{c.split(',')[0]}: {f}" for c, f in zip(d["comparison"], d["fixed"], strict=True)])
        sns.barplot(data=d, y="label", x="spread", hue="comparison", dodge=False, ax=ax)
        ax.set(
            xscale="log",
            xlim=(1, None),
            xlabel="slowest / fastest time (×)",
            ylabel="",
            title=f"{regime} at {int(d['length'].iloc[0]):,} tokens"
            + (f", batch {int(d['batch'].iloc[0])}" if regime == "decode" else ""),
        )
        ax.legend(fontsize=7)
    fig.suptitle("Kernel choice against architecture")
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
