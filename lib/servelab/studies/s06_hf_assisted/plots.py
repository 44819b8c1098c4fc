"""Study 6 figures, one idea each, readable at the book's column width: speedup against output length (HF's API,
then the project's engine), and what a draft step costs; the seed's values drawn where one exists."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

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
WIDTH = 7.8  # inches: the book's column


def _nothing(why: str):
    """A small figure that says what is missing, so a partial run still renders every section."""
    fig, ax = plt.subplots(figsize=(WIDTH, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center")
    return fig


def speedup_vs_length(speedups: pd.DataFrame, device_name: str, methods=("assisted", "prompt_lookup"), seed=True):
    """Median speedup over the plain baseline (quartile bars) against output length, one line per method and pair,
    with the number of prompts at the longest length; the seed's best pair as a star."""
    d = speedups[speedups["method"].isin(methods)] if len(speedups) else speedups
    if d.empty:
        return _nothing("no speedup measured for these methods")
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6))
    for (method, pair), g in d.groupby(["method", "pair"], sort=True):
        g = g.sort_values("length")
        n = int(g["prompts"].iloc[-1])
        ax.errorbar(
            g["length"],
            g["speedup_median"],
            yerr=[g["speedup_median"] - g["speedup_p25"], g["speedup_p75"] - g["speedup_median"]],
            marker="o",
            ls="--" if method == "prompt_lookup" else "-",
            capsize=3,
            label=f"{METHOD_LABELS.get(method, method)}: {pair} (n={n})",
        )
    ax.axhline(1.0, color="k", lw=1, label="break-even")
    if seed:
        ax.plot([SEED_LENGTH], [SEED_BEST_SPEEDUP], "r*", ms=14, label=f"RTX 2070 (seed): {SEED_BEST_PAIR}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="output length (tokens)", ylabel="speedup (×)", title=f"{device_name}, greedy, batch 1")
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def cost_vs_params(pairs: pd.DataFrame, device_name: str):
    """Measured cost ratio c (draft decode ms/token over the target's) against the parameter ratio."""
    d = pairs.drop_duplicates("pair").dropna(subset=["cost_ratio"]) if len(pairs) else pairs
    if d.empty:
        return _nothing("no cost ratio measured (the plain runs of a pair failed or were skipped)")
    fig, ax = plt.subplots(figsize=(WIDTH, 4.4))
    ax.scatter(d["params_ratio"], d["cost_ratio"], s=50, zorder=3, label=f"{device_name}, HF eager")
    for r in d.itertuples():
        ax.annotate(r.pair, (r.params_ratio, r.cost_ratio), fontsize=9, xytext=(4, 4), textcoords="offset points")
    lim = [0, 1.05]
    ax.plot(lim, lim, "k--", lw=1, label="c = parameter ratio")
    ax.plot([SEED_QWEN_PARAMS_RATIO], [SEED_QWEN_COST_RATIO], "r*", ms=12,
            label="RTX 2070 (seed, F3.3): Qwen2-0.5B → 1.5B")  # fmt: skip
    ax.set(xlim=lim, ylim=lim, xlabel="parameter ratio draft / target", ylabel="cost ratio c (decode ms/token)")
    ax.legend(fontsize=9, loc="lower right")
    fig.tight_layout()
    return fig
