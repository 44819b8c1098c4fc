"""Study 7 figures: measured times beside their roofline floors, speedups beside the seed's values."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from servelab.studies.s07_prefix_cache.verdicts import (
    SEED_ALPHA,
    SEED_BREAKEVEN,
    SEED_LFU_HIT,
    SEED_PREFIX,
    SEED_SLOTS,
    SEED_SPEEDUP_512,
    SEED_TURN_SPEEDUP,
    SEED_TURNS,
    policy_name,
)

MODE_COLORS = {
    "uncached": "tab:blue",
    "cached": "tab:orange",
    "independent": "tab:blue",
    "shared": "tab:orange",
    "off": "tab:blue",
    "on": "tab:orange",
}


def _log2_ticks(ax, values) -> None:
    values = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticklabels([f"{v:,}" for v in values], rotation=45 if len(values) > 6 else 0)


def _err(d: pd.DataFrame):
    return np.vstack([d["median_ms"] - d["p25_ms"], d["p75_ms"] - d["median_ms"]])


def _seed_star(ax, x, y, label: str) -> None:
    """The seed's RTX 2070 measurement, one red star beside the measured curve."""
    ax.plot([x], [y], marker="*", ms=14, color="tab:red", ls="", label=f"RTX 2070 (seed): {label}")


def _finish(fig, title: str):
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def ttft_vs_prefix(df: pd.DataFrame, sp: pd.DataFrame, title: str):
    """Left: TTFT (median, IQR bars) cached and uncached against the prefix length, each with its roofline floor
    (dashed). Right: the speedup, with the seed's value at 512 tokens."""
    ok = df[df["status"] == "ok"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 4.2))
    for mode, d in ok.groupby("mode"):
        d = d.sort_values("prefix_tokens")
        a.errorbar(
            d["prefix_tokens"],
            d["median_ms"],
            yerr=_err(d),
            marker="o",
            capsize=3,
            color=MODE_COLORS[mode],
            label=f"{mode}: measured",
        )
        if "floor_ms" in d:
            a.plot(
                d["prefix_tokens"],
                d["floor_ms"],
                ls="--",
                color=MODE_COLORS[mode],
                alpha=0.7,
                label=f"{mode}: roofline floor",
            )
    a.set(yscale="log", xlabel="shared prefix (tokens)", ylabel="time to first token (ms, log)", title="TTFT")
    _log2_ticks(a, df["prefix_tokens"])
    a.legend(fontsize=9)
    if len(sp):
        b.errorbar(
            sp["prefix_tokens"],
            sp["speedup"],
            yerr=np.vstack([sp["speedup"] - sp["speedup_lo"], sp["speedup_hi"] - sp["speedup"]]).clip(0),
            marker="o",
            capsize=3,
            color="tab:green",
            label="measured (uncached / cached)",
        )
        _log2_ticks(b, sp["prefix_tokens"])
    b.axhline(1.0, color="grey", lw=0.8)
    _seed_star(b, SEED_PREFIX, SEED_SPEEDUP_512, f"{SEED_SPEEDUP_512}× at {SEED_PREFIX}")
    b.set(yscale="log", xlabel="shared prefix (tokens)", ylabel="TTFT speedup (×, log)", title="speedup from the cache")
    b.legend(fontsize=9)
    return _finish(fig, title)


def multi_turn(mt: pd.DataFrame, ts: pd.DataFrame, title: str):
    """Left: TTFT per turn, cached and uncached. Right: speedup per turn (TTFT and whole turn), seed marked."""
    ok = mt[(mt["status"] == "ok") & (mt["metric"] == "ttft")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 4.2))
    for mode, d in ok.groupby("mode"):
        d = d.sort_values("turn")
        a.errorbar(d["turn"], d["median_ms"], yerr=_err(d), marker="o", capsize=3, color=MODE_COLORS[mode], label=mode)
    a.set(xlabel="turn", ylabel="time to first token (ms)", title="TTFT per turn")
    a.legend(fontsize=9)
    labels = {"ttft": "first token", "turn": "whole turn (first token + reply)"}
    for metric, d in ts.groupby("metric"):
        d = d.sort_values("turn")
        b.plot(d["turn"], d["speedup"], marker="o", label=labels.get(metric, metric))
    b.axhline(1.0, color="grey", lw=0.8)
    _seed_star(b, SEED_TURNS, SEED_TURN_SPEEDUP, f"{SEED_TURN_SPEEDUP}× after {SEED_TURNS} turns")
    b.set(xlabel="turn", ylabel="speedup, uncached / cached (×)", title="speedup per turn")
    b.legend(fontsize=9)
    return _finish(fig, title)


def batch_sharing(df: pd.DataFrame, be: pd.DataFrame, title: str):
    """Per prefix length: time per request against the batch size n, shared and independent (floors dashed);
    the measured breakeven (vertical line) and the seed's."""
    ok = df[df["status"] == "ok"]
    prefixes = sorted(ok["prefix_tokens"].unique())
    fig, axes = plt.subplots(1, max(1, len(prefixes)), figsize=(8, 3.9), squeeze=False)
    for ax, p in zip(axes[0], prefixes, strict=False):  # one axis even with no prefix
        for sharing, d in ok[ok["prefix_tokens"] == p].groupby("sharing"):
            d = d.sort_values("n")
            ax.errorbar(
                d["n"],
                d["ms_per_request"],
                yerr=_err(d) / d["n"].to_numpy(),
                marker="o",
                capsize=3,
                color=MODE_COLORS[sharing],
                label=sharing,
            )
            if "floor_ms" in d:
                ax.plot(
                    d["n"],
                    d["floor_ms"] / d["n"],
                    ls="--",
                    color=MODE_COLORS[sharing],
                    alpha=0.7,
                    label=f"{sharing}: floor",
                )
        row = be[be["prefix_tokens"] == p]
        if len(row) and not np.isnan(row["breakeven_n"].iloc[0]):
            ax.axvline(row["breakeven_n"].iloc[0], color="tab:green", ls=":", label="measured breakeven")
        if p in SEED_BREAKEVEN:
            ax.axvline(SEED_BREAKEVEN[p], color="tab:red", ls="-.", alpha=0.7, label="RTX 2070 (seed) breakeven")
        ax.set(
            yscale="log",
            xlabel="requests sharing the prefix (n)",
            ylabel="ms per request (log)",
            title=f"prefix {p:,} tokens",
        )
        _log2_ticks(ax, ok["n"])
        ax.legend(fontsize=9)
    return _finish(fig, title)


def policy_hit_rates(sim: pd.DataFrame, title: str):
    """Hit rate against capacity (slots of whole prefixes; block-granular radix at the same memory), one panel
    per Zipf α, the static optimum dashed, the seed's LFU point at α = 2.0 with 4 slots."""
    alphas = sorted(sim["alpha"].unique())
    cols = min(3, len(alphas))
    rows = -(-len(alphas) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8, 2.9 * rows + 0.5), squeeze=False, sharey=True)
    for ax, alpha in zip(axes.flat, alphas, strict=False):  # the grid may have spare axes
        d = sim[sim["alpha"] == alpha]
        named = d.assign(policy=d["policy"].map(lambda q: "radix (blocks)" if q == "radix" else policy_name(q)))
        sns.lineplot(data=named, x="capacity", y="hit_rate", hue="policy", marker="o", ax=ax, legend=ax is axes.flat[0])
        opt = d[d["unit"] == "prefix"].drop_duplicates("capacity").sort_values("capacity")
        ax.plot(opt["capacity"], opt["optimum"], ls="--", color="black", label="static top-k optimum")
        if alpha == SEED_ALPHA:
            _seed_star(ax, SEED_SLOTS, SEED_LFU_HIT, f"LFU {SEED_LFU_HIT:.0%}")
            ax.legend(fontsize=9)
        ax.set(ylim=(0, 1), xlabel="capacity (prefix slots)", ylabel="hit rate", title=f"Zipf α = {alpha:g}")
        _log2_ticks(ax, d["capacity"])
    if axes.flat[0].get_legend() is not None:
        axes.flat[0].legend(fontsize=9)
    for ax in list(axes.flat)[len(alphas) :]:
        ax.set_visible(False)
    return _finish(fig, title)


def serving(req: pd.DataFrame, summary: pd.DataFrame, title: str):
    """Left: TTFT distributions (ECDF) per load, caching off and on. Right: throughput (output and prompt tokens/s)."""
    ok = req[req["ok"].astype(bool)] if len(req) else req
    loads = list(dict.fromkeys(summary["load"])) if len(summary) else []
    fig, axes = plt.subplots(1, len(loads) + 1, figsize=(8, 3.9), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=False):  # the last axis is not a load's
        d = ok[ok["load"] == load] if len(ok) else ok
        if len(d):
            sns.ecdfplot(data=d, x="ttft_ms", hue="caching", palette=MODE_COLORS, ax=ax)
        ax.set(
            xscale="log",
            xlabel="time to first token (ms, log)",
            ylabel="fraction of requests",
            title=f"TTFT, {load} arrivals",
        )
    s = summary[summary["status"] == "ok"] if len(summary) else summary
    ax = axes[0][-1]
    if len(s):
        long = s.melt(
            id_vars=["load", "caching"],
            value_vars=["throughput_tok_s", "prompt_throughput_tok_s"],
            var_name="tokens",
            value_name="tokens/s",
        )
        long["what"] = (
            long["load"]
            + ", "
            + long["tokens"].map({"throughput_tok_s": "output", "prompt_throughput_tok_s": "prompt"})
        )
        sns.barplot(data=long, x="what", y="tokens/s", hue="caching", palette=MODE_COLORS, ax=ax)
        ax.tick_params(axis="x", rotation=30)
    ax.set(yscale="log", xlabel="", ylabel="throughput (tokens/s, log)", title="throughput")
    return _finish(fig, title)
