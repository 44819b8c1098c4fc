"""Figures of notebook 08: real against simulated, the error before and after the overhead terms, capacity."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import NullFormatter

from servelab.studies.s08_simulator.context_reads import excess_by_context

# the routers as the page names them (the identifiers stay in the code and the CSVs)
ROUTER_WORDS = {
    "round_robin": "round-robin",
    "least_outstanding": "least-outstanding",
    "prefix_affinity": "prefix affinity",
}

GOAL_PCT = 10.0  # issue 7's goal for the median |error|


def plot_real_vs_sim(table: pd.DataFrame, cost_model: str = "gpu+overheads", title: str = ""):
    """One panel per metric: simulated against measured value, one point per run, the y = x line and a ±10 %
    band; filled markers for validation runs, hollow for calibration runs."""
    t = table[(table["cost_model"] == cost_model)].dropna(subset=["real", "sim"])
    metrics = list(dict.fromkeys(t["metric"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.3), squeeze=False)
    palette = dict(zip(sorted(t["scheduler"].unique()), sns.color_palette("colorblind"), strict=False))  # 10 colours
    for ax, m in zip(axes[0], metrics, strict=True):
        d = t[t["metric"] == m]
        for (sched, sub), g in d.groupby(["scheduler", "subset"]):
            c = palette[sched]
            ax.scatter(
                g["real"],
                g["sim"],
                s=28,
                label=f"{sched} ({sub})",
                facecolors=c if sub == "validation" else "none",
                edgecolors=c,
            )
        pos = d[["real", "sim"]].to_numpy()
        pos = pos[np.isfinite(pos).all(axis=1) & (pos > 0).all(axis=1)]
        if len(pos):
            lo, hi = pos.min() / 1.5, pos.max() * 1.5
            x = np.geomspace(lo, hi, 50)
            ax.plot(x, x, color="k", lw=1)
            ax.fill_between(x, x * (1 - GOAL_PCT / 100), x * (1 + GOAL_PCT / 100), color="k", alpha=0.1, lw=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # a narrow log range otherwise labels every minor tick
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
    state = np.random.get_state()  # seaborn jitters with the global generator: seed it here, for identical pages
    np.random.seed(0)
    try:
        sns.stripplot(data=v, x="metric", y="error_pct", hue="cost_model", dodge=True, ax=ax, size=5, jitter=0.15)
    finally:
        np.random.set_state(state)
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
    for (router, g), (marker, ls) in zip(needed.groupby("router"), styles * 4, strict=False):
        g = g.sort_values("rate")
        # distinct markers and dashes: routers that need the same count would otherwise hide each other
        name = ROUTER_WORDS.get(router, router)
        ax.plot(g["rate"], g["replicas"], marker=marker, ls=ls, ms=7, mfc="none", label=name)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("replicas needed to meet the SLO")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_prefix_replay(table: pd.DataFrame, cost_model: str = "gpu+overheads", title: str = ""):
    """Study 7's server runs, real against simulated: one panel per metric, a pair of bars per run
    (load × caching), log scale."""
    t = table[table["cost_model"] == cost_model].assign(run=lambda d: d["load"] + ", caching " + d["caching"])
    metrics = list(dict.fromkeys(t["metric"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(2.6 * len(metrics), 3.4), squeeze=False)
    for ax, m in zip(axes[0], metrics, strict=True):
        d = t[t["metric"] == m].melt(id_vars=["run"], value_vars=["real", "sim"], var_name="source", value_name="v")
        sns.barplot(data=d, x="run", y="v", hue="source", ax=ax, palette=["0.35", "tab:orange"])
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(m)
        ax.set_xlabel("")
        ax.set_ylabel("tok/s" if m == "throughput" else "ms")
        ax.tick_params(axis="x", rotation=60, labelsize=7)
        if ax is not axes[0][0]:
            ax.get_legend().remove()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_affinity(table: pd.DataFrame, title: str = ""):
    """Routers over replicas with prefix caches: hit rate (top) and p99 TTFT (bottom) against request rate,
    one column per KV pool size."""
    pools = sorted(table["pool_blocks"].unique(), reverse=True)
    fig, axes = plt.subplots(2, len(pools), figsize=(4.2 * len(pools), 6), squeeze=False, sharex=True)
    styles = [("o", "-"), ("s", "--"), ("^", ":")]
    for j, pool in enumerate(pools):
        d = table[table["pool_blocks"] == pool]
        for (router, g), (marker, ls) in zip(d.groupby("router"), styles * 4, strict=False):
            g = g.sort_values("rate")
            name = ROUTER_WORDS.get(router, router)
            axes[0][j].plot(g["rate"], 100 * g["hit_rate"], marker=marker, ls=ls, mfc="none", label=name)
            axes[1][j].plot(g["rate"], g["ttft_p99_ms"], marker=marker, ls=ls, mfc="none", label=name)
        axes[0][j].set_title(f"KV pool {pool:,} blocks per replica")
        axes[0][j].set_ylabel("prefix-cache hit rate (%)")
        axes[1][j].set_ylabel("p99 TTFT (ms)")
        axes[1][j].set_yscale("log")
        axes[1][j].yaxis.set_minor_formatter(NullFormatter())
        axes[1][j].set_xlabel("request rate (req/s)")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_prefill_check(check: pd.DataFrame, title: str = ""):
    """Study 7's single prompts: measured step time against each cost model's, by shared-prefix length; one
    panel for the uncached prompts (the whole prompt computed), one for the cached (a short suffix after it)."""
    modes = list(dict.fromkeys(check["mode"]))
    fig, axes = plt.subplots(1, len(modes), figsize=(4.6 * len(modes), 3.5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        d = check[check["mode"] == mode]
        real = d.drop_duplicates("prefix_tokens").sort_values("prefix_tokens")
        ax.plot(real["prefix_tokens"], real["real_ms"], "ko-", label="measured (Study 7)")
        for (cm, g), ls in zip(d.groupby("cost_model", sort=False), ["--", ":", "-."], strict=False):
            g = g.sort_values("prefix_tokens")
            ax.plot(g["prefix_tokens"], g["sim_ms"], ls=ls, marker="s", mfc="none", label=f"cost model: {cm}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("shared prefix (tokens)")
        ax.set_ylabel("engine step (ms)")
        ax.set_title(f"{mode} prompts")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_context_reads(excess: pd.DataFrame, decode: pd.DataFrame, title: str = ""):
    """Left: a served step's mixed-step excess (``context_reads.mixed_step_excess``) against its longest context,
    binned medians with their interquartile range, and the cost model's price. Right: Study 2's decode steps
    against the context of each sequence, measured and priced before and after the longest-sequence term
    (``context_reads.decode_walk_check``), for the smallest and largest batch."""
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    ax = axes[0]
    if len(excess):
        binned = excess_by_context(excess)
        mid = binned["longest_context"]
        q = binned[["q25", "q50", "q75"]].set_axis([0.25, 0.5, 0.75], axis=1)
        ax.errorbar(
            mid,
            q[0.5],
            yerr=[q[0.5] - q[0.25], q[0.75] - q[0.5]],
            fmt="ko",
            capsize=3,
            label=f"measured: step less the rest of the model (median, IQR; {len(excess):,} steps)",
        )
        line = excess.sort_values("longest_context")
        ax.plot(line["longest_context"], line["priced_ms"], "C1-", label="priced: mixed-step cost + longest walk")
    ax.set_xlabel("longest context in the step (tokens)")
    ax.set_ylabel("ms")
    ax.set_title("mixed steps of the server (chunk + decodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    if len(decode):
        for batch, color in zip(sorted({decode["batch"].min(), decode["batch"].max()}), ["C0", "C3"], strict=False):
            d = decode[decode["batch"] == batch].sort_values("context")
            ax.plot(d["context"], d["measured_ms"], "o", color=color, label=f"measured, batch {batch}")
            ax.plot(d["context"], d["before_ms"], ":", color=color, label=f"Study 2's fit, batch {batch}")
            ax.plot(d["context"], d["after_ms"], "-", color=color, label=f"with the longest sequence, batch {batch}")
        ax.set_xscale("log", base=2)
    ax.set_xlabel("context of each sequence (tokens)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("decode-only steps (Study 2)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
