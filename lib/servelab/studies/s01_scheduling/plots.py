"""Study 1's figures (matplotlib/seaborn); each returns its Figure, the notebook shows it.

A *setting* is a policy with its budget (``chunked_prefill@512``); FCFS and EagerContBatch prefill whole
prompts, so their budget is not part of their name. The RTX 2070's worst-case stalls (claim F1.1) are
drawn, labelled as the seed's, where stalls are plotted.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from servelab.loadgen.metrics import request_metrics
from servelab.studies.s01_scheduling.verdicts import SEED_STALL_CHUNKED_MS, SEED_STALL_EAGER_MS, short

ORDER = ["fcfs", "eager_cont_batch", "chunked_prefill"]


def setting(scheduler: pd.Series, budget: pd.Series) -> pd.Series:
    return pd.Series(
        np.where(scheduler == "chunked_prefill", scheduler + "@" + budget.astype(str), scheduler), index=scheduler.index
    )


def _settings_order(df: pd.DataFrame) -> list[str]:
    keys = df[["scheduler", "budget"]].drop_duplicates()
    keys = keys.assign(o=keys["scheduler"].map(ORDER.index)).sort_values(["o", "budget"])
    return setting(keys["scheduler"], keys["budget"]).tolist()


def per_request(requests: pd.DataFrame) -> pd.DataFrame:
    """``request_metrics`` of every run, with the run's keys and its setting."""
    keys = ["model", "scheduler", "budget", "rate", "rate_fraction", "sweep"]
    out = []
    for k, g in requests.groupby(keys, sort=False):
        m = request_metrics(g)
        out.append(m.assign(**dict(zip(keys, k, strict=True))))
    df = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    if not df.empty:
        df["setting"] = setting(df["scheduler"], df["budget"])
    return df


def _seed_stalls(ax, axis: str = "x") -> None:
    line = ax.axvline if axis == "x" else ax.axhline
    line(SEED_STALL_EAGER_MS, color="grey", ls=":", lw=1, label="RTX 2070 worst stall, EagerContBatch (seed)")
    line(SEED_STALL_CHUNKED_MS, color="grey", ls="--", lw=1, label="RTX 2070 worst stall, ChunkedPrefill (seed)")


def latency_cdfs(req_metrics: pd.DataFrame, rate_fraction: float, device: str):
    """TTFT and ITL CDFs of every setting at one rate fraction, one row per model."""
    d = req_metrics[
        (req_metrics["sweep"] == "rate") & (req_metrics["rate_fraction"] == rate_fraction) & req_metrics["ok"]
    ]
    models = list(dict.fromkeys(d["model"]))
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    order = _settings_order(d)
    for row, model in zip(axes, models, strict=True):
        g = d[d["model"] == model]
        sns.ecdfplot(data=g, x="ttft_ms", hue="setting", hue_order=order, log_scale=True, ax=row[0])
        itl = g[["setting", "itl"]].explode("itl").dropna().astype({"itl": float})
        sns.ecdfplot(data=itl, x="itl", hue="setting", hue_order=order, log_scale=True, ax=row[1])
        _seed_stalls(row[1])
        rate = g["rate"].iloc[0] if len(g) else float("nan")
        row[0].set(
            xlabel="time to first token (ms)",
            ylabel="fraction of requests",
            title=f"{short(model)}: TTFT at {rate:.2f} req/s",
        )
        row[1].set(
            xlabel="inter-token latency (ms)",
            ylabel="fraction of token gaps",
            title=f"{short(model)}: ITL at {rate:.2f} req/s",
        )
        row[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Latency distributions on {device} (Poisson arrivals, ShareGPT-like lengths)")
    fig.tight_layout()
    return fig


def stall_distribution(req_metrics: pd.DataFrame, device: str):
    """Each request's worst decode stall (its max ITL), per setting and rate, one panel per model."""
    d = req_metrics[(req_metrics["sweep"] == "rate") & req_metrics["max_itl_ms"].notna()]
    models = list(dict.fromkeys(d["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        g = d[d["model"] == model].copy()
        g["rate (req/s)"] = g["rate"].map(lambda r: f"{r:.2f}")
        sns.boxplot(
            data=g,
            x="rate (req/s)",
            y="max_itl_ms",
            hue="setting",
            hue_order=_settings_order(g),
            log_scale=True,
            ax=ax,
            fliersize=2,
        )
        _seed_stalls(ax, "y")
        ax.set(ylabel="worst stall per request: max ITL (ms)", title=f"{short(model)}: decode stalls")
        ax.legend(fontsize=7)
    fig.suptitle(f"Decode stalls on {device}")
    fig.tight_layout()
    return fig


def throughput_latency(summary: pd.DataFrame, device: str):
    """Delivered throughput against p99 ITL and p50 TTFT, a line per setting through its rates; the ITL
    SLO of the capacity definition drawn."""
    s = summary[(summary["status"] == "ok") & (summary["sweep"] == "rate")].copy()
    s["setting"] = setting(s["scheduler"], s["budget"])
    models = list(dict.fromkeys(s["model"]))
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        g = s[s["model"] == model].sort_values("rate")
        order = _settings_order(g)
        for ax, y, label in (
            (row[0], "itl_p99_ms", "p99 inter-token latency (ms)"),
            (row[1], "ttft_p50_ms", "median TTFT (ms)"),
        ):
            sns.lineplot(
                data=g,
                x="delivered_tok_s",
                y=y,
                hue="setting",
                hue_order=order,
                marker="o",
                ax=ax,
                sort=False,
                estimator=None,
            )
            ax.set(xlabel="delivered throughput (output tokens/s)", ylabel=label, yscale="log", title=f"{short(model)}")
        slo = g["slo_itl_ms"].dropna()
        if len(slo):
            row[0].axhline(slo.iloc[0], color="red", ls="--", lw=1, label=f"ITL SLO {slo.iloc[0]:.1f} ms")
            row[0].legend(fontsize=7)
    fig.suptitle(f"Throughput against latency on {device} (each point one offered rate)")
    fig.tight_layout()
    return fig


def capacity_bars(capacity: pd.DataFrame, device: str):
    """Capacity at the ITL SLO per setting, one panel per model."""
    c = capacity.copy()
    c["setting"] = setting(c["scheduler"], c["budget"])
    models = list(dict.fromkeys(c["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        g = c[c["model"] == model]
        sns.barplot(data=g, x="setting", y="capacity_req_s", order=_settings_order(g), ax=ax, color="tab:blue")
        for i, (_, r) in enumerate(g.set_index("setting").loc[_settings_order(g)].iterrows()):
            ax.annotate(r["bound"], (i, r["capacity_req_s"]), ha="center", va="bottom", fontsize=7)
        ax.set(
            xlabel="",
            ylabel="capacity (requests/s)",
            title=f"{short(model)}: p99 ITL ≤ {g['slo_itl_ms'].iloc[0]:.1f} ms",
        )
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"Capacity at an SLO (Sarathi-Serve's definition) on {device}")
    fig.tight_layout()
    return fig


def stall_window(steps: pd.DataFrame, span_s: float = 1.0) -> tuple[float, float]:
    """A window of ``span_s`` seconds around the run's longest step (where the worst stall comes from)."""
    if steps.empty:
        return 0.0, span_s
    i = (steps["end_s"] - steps["start_s"]).idxmax()
    mid = float(steps.loc[i, "start_s"])
    return max(0.0, mid - span_s / 2), max(0.0, mid - span_s / 2) + span_s


def timeline(steps: pd.DataFrame, model: str, rate_fraction: float, device: str, span_s: float = 1.0):
    """Per setting, the tokens of each engine step (prefill stacked on decode) over time, around the
    run's longest step, with each step's duration."""
    d = steps[(steps["model"] == model) & (steps["sweep"] == "rate") & (steps["rate_fraction"] == rate_fraction)]
    order = _settings_order(d) if len(d) else []
    fig, axes = plt.subplots(len(order), 1, figsize=(12, 2.3 * max(1, len(order))), squeeze=False)
    d = d.assign(setting=setting(d["scheduler"], d["budget"]))
    for ax, name in zip(axes[:, 0], order, strict=False):  # no setting: one empty panel
        g = d[d["setting"] == name]
        lo, hi = stall_window(g, span_s)
        w = g[(g["start_s"] >= lo) & (g["start_s"] <= hi)]
        width = (w["end_s"] - w["start_s"]).to_numpy()
        ax.bar(w["start_s"], w["decode_tokens"], width=width, align="edge", color="tab:blue", label="decode tokens")
        ax.bar(
            w["start_s"],
            w["prefill_tokens"],
            width=width,
            bottom=w["decode_tokens"],
            align="edge",
            color="tab:orange",
            label="prefill tokens",
        )
        ax.set_yscale("symlog", linthresh=10)  # a few decode tokens stay visible under thousands of prefill
        ax.set(
            ylabel="tokens / step",
            xlim=(lo, hi),
            title=f"{name}: longest step {(g['end_s'] - g['start_s']).max() * 1e3:.1f} ms" if len(g) else name,
        )
        ax2 = ax.twinx()
        ax2.plot(w["start_s"], width * 1e3, "k.", ms=3, label="step time")
        ax2.set(ylabel="step (ms)")
        ax.legend(loc="upper left", fontsize=7)
    axes[-1, 0].set_xlabel("time since the run started (s)")
    rate = d["rate"].iloc[0] if len(d) else float("nan")
    fig.suptitle(f"{short(model)} on {device}: batch composition per engine step at {rate:.2f} req/s")
    fig.tight_layout()
    return fig


def budget_sweep(summary: pd.DataFrame, model: str, rate_fraction: float, device: str):
    """ChunkedPrefill's budget against its worst stall, p99 ITL, mean TTFT and throughput at one rate, with
    EagerContBatch and FCFS at the same rate as horizontal lines."""
    s = summary[(summary["status"] == "ok") & (summary["model"] == model) & (summary["rate_fraction"] == rate_fraction)]
    c = s[s["scheduler"] == "chunked_prefill"].sort_values("budget")
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    for ax, y, label in zip(
        axes,
        ["max_itl_ms", "itl_p99_ms", "mean_ttft_ms", "delivered_tok_s"],
        ["worst stall: max ITL (ms)", "p99 ITL (ms)", "mean TTFT (ms)", "delivered tokens/s"],
        strict=True,
    ):
        ax.plot(c["budget"], c[y], "o-", label="chunked_prefill")
        for name, ls in (("eager_cont_batch", "--"), ("fcfs", ":")):
            v = s.loc[s["scheduler"] == name, y]
            if len(v):
                ax.axhline(v.iloc[0], color="k", ls=ls, lw=1, label=name)
        ax.set(xscale="log", xlabel="token budget per step", ylabel=label)
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=7)
    rate = s["rate"].iloc[0] if len(s) else float("nan")
    fig.suptitle(f"{short(model)} on {device}: ChunkedPrefill's token budget at {rate:.2f} req/s")
    fig.tight_layout()
    return fig
