"""Figures of the engine's benchmark tables (for the book; the notebook only calls these)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

IMPL_ORDER = [
    "hf_eager",
    "hf_cuda_graph",
    "engine_gather",
    "engine_triton",
    "engine_triton_compiled",
    "engine_gather_compiled",
]


def plot_decode_steps(decode: pd.DataFrame, ax=None):
    """Decode-step time per implementation (log scale), one group per (batch, context), with the roofline floor."""
    df = decode[decode["status"] == "ok"].copy()
    df["point"] = "batch " + df["batch"].astype(str) + ", context " + df["context"].astype(str)
    order = [i for i in IMPL_ORDER if i in set(df["impl"])] + sorted(set(df["impl"]) - set(IMPL_ORDER))
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    sns.barplot(df, x="point", y="median_ms", hue="impl", hue_order=order, ax=ax)
    points = list(dict.fromkeys(df["point"]))
    floors = df.groupby("point")["floor_ms"].first()
    for i, p in enumerate(points):  # the floor of each group as a horizontal mark across its bars
        ax.hlines(
            floors[p], i - 0.45, i + 0.45, colors="black", linestyles="--", label="roofline floor" if i == 0 else None
        )
    ax.set_yscale("log")
    ax.set_xlabel("")
    ax.set_ylabel("decode step (ms, log scale)")
    ax.legend(fontsize=8)
    return ax
