"""Study 6 figures: training curves of the family, speedup against output length and cost ratio, decode
cost per model against its roofline floor; the seed's values marked."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from servelab.studies.s06_hf_assisted.verdicts import SEED_BEST_PAIR, SEED_BEST_SPEEDUP, SEED_LENGTH

METHOD_LABELS = {
    "assisted": "assistant_model",
    "prompt_lookup": "prompt lookup",
    "own": "servelab speculative",
    "own_plain": "servelab engine, target alone",
}
# F3.3's seed pair, for context on the cost-ratio figure: Qwen2-0.5B → 1.5B, params ratio 1/3.1, measured c 1/1.18
SEED_QWEN_PARAMS_RATIO = 1 / 3.1
SEED_QWEN_COST_RATIO = 1 / 1.18


def _nothing(why: str):
    """A small figure that says what is missing, so a partial run still renders every section."""
    fig, ax = plt.subplots(figsize=(6, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center")
    return fig


def loss_curves(loss: pd.DataFrame, title: str):
    """Train loss against tokens seen per model, with the held-out (eval) loss as markers."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    palette = dict(zip(loss["model"].unique(), sns.color_palette("tab10"), strict=False))  # ≤ 10 models
    for m, g in loss.groupby("model", sort=False):
        ax.plot(g["tokens"] / 1e6, g["train_loss"], color=palette[m], label=f"{m} (train)")
        e = g.dropna(subset=["eval_loss"])
        ax.plot(e["tokens"] / 1e6, e["eval_loss"], "o", color=palette[m], mec="k", label=f"{m} (held-out)")
    ax.set(xlabel="tokens seen (millions)", ylabel="cross-entropy (nats/token)", title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def speedup_vs_length(summary: pd.DataFrame, device_name: str):
    """Median speedup over plain generate (quartile bars) against output length, per method and pair: HF's
    API on the left (assistant_model, prompt lookup), the project's own decoder on the right."""
    d = summary.copy()
    if d.empty:
        return _nothing("no speedup measured (every run failed or was skipped)")
    d["label"] = d["method"].map(METHOD_LABELS).fillna(d["method"]) + ": " + d["pair"]
    panels = [("HF generate", ["assisted", "prompt_lookup"]), ("servelab", ["own", "own_plain"])]
    panels = [(t, m) for t, m in panels if d["method"].isin(m).any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False, sharey=True)
    for ax, (title, methods) in zip(axes[0], panels, strict=True):
        for label, g in d[d["method"].isin(methods)].groupby("label"):
            g = g.sort_values("length")
            ls = {"assisted": "-", "prompt_lookup": "--", "own": "-", "own_plain": ":"}.get(g["method"].iloc[0], "-")
            ax.errorbar(
                g["length"],
                g["speedup_median"],
                yerr=[g["speedup_median"] - g["speedup_p25"], g["speedup_p75"] - g["speedup_median"]],
                marker="o",
                ls=ls,
                capsize=3,
                label=label,
            )
        ax.axhline(1.0, color="k", lw=1, label="plain HF generate (break-even)")
        ax.plot([SEED_LENGTH], [SEED_BEST_SPEEDUP], "r*", ms=14, label=f"RTX 2070 (seed): {SEED_BEST_PAIR}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="output length (tokens)", ylabel="speedup over plain HF generate (×)", title=title)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Greedy speculative decoding on {device_name}, batch 1: median over prompts (bars: quartiles)")
    fig.tight_layout()
    return fig


def cost_ratio(pairs: pd.DataFrame, device_name: str, length: int | None):
    """Left: measured cost ratio c against the parameter ratio (the dashed line is what parameter counts
    suggest). Right: speedup at ``length`` output tokens against c, labelled with α (``pairs``: the pair ×
    length table; ``length`` None: no length has enough pairs, the right panel stays empty)."""
    at = pairs[pairs["length"] == length] if length is not None else pairs.iloc[:0]
    d = pairs.drop_duplicates("pair").dropna(subset=["cost_ratio"])
    if d.empty:
        return _nothing("no cost ratio measured (the plain runs of a pair failed or were skipped)")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    ax.scatter(d["params_ratio"], d["cost_ratio"], s=50, zorder=3, label=f"{device_name}, HF eager")
    for r in d.itertuples():
        ax.annotate(r.pair, (r.params_ratio, r.cost_ratio), fontsize=7, xytext=(4, 4), textcoords="offset points")
    lim = [0, 1.05]
    ax.plot(lim, lim, "k--", lw=1, label="c = parameter ratio")
    ax.plot(
        [SEED_QWEN_PARAMS_RATIO], [SEED_QWEN_COST_RATIO], "r*", ms=12, label="RTX 2070 (seed, F3.3): Qwen2-0.5B → 1.5B"
    )
    ax.set(
        xlim=lim,
        ylim=lim,
        xlabel="parameter ratio draft / target",
        ylabel="cost ratio c (decode ms/token)",
        title="What a draft step costs",
    )
    ax.legend(fontsize=7)
    ax = axes[1]
    d = at.dropna(subset=["cost_ratio", "speedup_median"])
    ax.errorbar(
        d["cost_ratio"],
        d["speedup_median"],
        yerr=[d["speedup_median"] - d["speedup_p25"], d["speedup_p75"] - d["speedup_median"]],
        fmt="o",
        capsize=3,
    )
    for r in d.itertuples():
        ax.annotate(
            f"{r.pair}\nα={r.alpha:.2f}",
            (r.cost_ratio, r.speedup_median),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.axhline(1.0, color="k", lw=1, label="break-even")
    ax.set(
        xlabel="cost ratio c",
        ylabel=f"speedup at {length} output tokens (×)" if length else "speedup (×)",
        title="Speedup against cost ratio",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def decode_cost(costs: pd.DataFrame, device_name: str):
    """Plain generate's decode ms/token per model (quartile bars) beside its roofline floor."""
    d = costs.sort_values("params")
    if d.empty:
        return _nothing("no plain generate run completed")
    x = np.arange(len(d))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(
        x,
        d["ms_per_token"],
        yerr=[d["ms_per_token"] - d["ms_per_token_p25"], d["ms_per_token_p75"] - d["ms_per_token"]],
        capsize=3,
        label="HF generate, measured",
    )
    if "floor_ms" in d:
        ax.scatter(
            x, d["floor_ms"], marker="_", s=600, color="k", zorder=3, label="roofline floor (weights / copy GB/s)"
        )
    ax.set_xticks(
        x,
        [f"{m}\n{p / 1e6:.0f}M, {n} layers" for m, p, n in zip(d["model"], d["params"], d["layers"], strict=True)],
        fontsize=8,
    )
    ax.set(yscale="log", ylabel="decode time (ms/token)", title=f"Decode cost per token on {device_name}, batch 1")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
