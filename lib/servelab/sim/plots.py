"""Figures of notebook 08: real against simulated, the error before and after the overhead terms, capacity."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter
import numpy as np
import pandas as pd
import seaborn as sns

GOAL_PCT = 10.0   # issue 7's goal for the median |error|


def plot_real_vs_sim(table: pd.DataFrame, cost_model: str = "gpu+overheads", title: str = ""):
    """One panel per metric: simulated against measured value, one point per run, the y = x line and a ±10 %
    band; filled markers for validation runs, hollow for calibration runs."""
    t = table[(table["cost_model"] == cost_model)].dropna(subset=["real", "sim"])
    metrics = list(dict.fromkeys(t["metric"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.3), squeeze=False)
    palette = dict(zip(sorted(t["scheduler"].unique()), sns.color_palette("colorblind")))
    for ax, m in zip(axes[0], metrics):
        d = t[t["metric"] == m]
        for (sched, sub), g in d.groupby(["scheduler", "subset"]):
            c = palette[sched]
            ax.scatter(g["real"], g["sim"], s=28, label=f"{sched} ({sub})",
                       facecolors=c if sub == "validation" else "none", edgecolors=c)
        pos = d[["real", "sim"]].to_numpy()
        pos = pos[np.isfinite(pos).all(axis=1) & (pos > 0).all(axis=1)]
        if len(pos):
            lo, hi = pos.min() / 1.5, pos.max() * 1.5
            x = np.geomspace(lo, hi, 50)
            ax.plot(x, x, color="k", lw=1)
            ax.fill_between(x, x * (1 - GOAL_PCT / 100), x * (1 + GOAL_PCT / 100), color="k", alpha=0.1, lw=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):   # a narrow log range otherwise labels every minor tick
                axis.set_minor_formatter(NullFormatter())
        unit = "tok/s" if m == "throughput" else "ms"
        ax.set_xlabel(f"real {m} ({unit})")
        ax.set_ylabel(f"simulated {m} ({unit})")
        ax.set_title(m)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(4, len(labels)), bbox_to_anchor=(0.5, 1.12), fontsize=8)
    fig.suptitle(title, y=1.18 if title else None)
    fig.tight_layout()
    return fig


def plot_error_before_after(table: pd.DataFrame, title: str = ""):
    """Signed error (%) per metric on the validation runs, GPU-only cost model against the one with the fitted
    overhead terms; the ±10 % goal shaded."""
    t = table.dropna(subset=["error_pct"])
    v = t[t["subset"] == "validation"]
    if v.empty:
        v = t
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.axhspan(-GOAL_PCT, GOAL_PCT, color="k", alpha=0.08, lw=0, label="±10 % goal")
    ax.axhline(0, color="k", lw=0.8)
    sns.stripplot(data=v, x="metric", y="error_pct", hue="cost_model", dodge=True, ax=ax, size=5, jitter=0.15)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("metric")
    ax.set_ylabel("simulated − real (% of real)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_capacity(needed: pd.DataFrame, title: str = ""):
    """Replicas needed against request rate, one line per router (points that no tried count met are left out)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    for (router, g), (marker, ls) in zip(needed.groupby("router"), styles * 4):
        g = g.sort_values("rate")
        # distinct markers and dashes: routers that need the same count would otherwise hide each other
        ax.plot(g["rate"], g["replicas"], marker=marker, ls=ls, ms=7, mfc="none", label=router)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("replicas needed to meet the SLO")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
