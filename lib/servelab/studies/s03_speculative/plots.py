"""Study 3 figures: acceptance, measured against predicted speedup, cost ratios per execution mode, where
speculation pays (α against c), and the cost of a verify step."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from servelab.studies.s03_speculative.verdicts import SEED_PARAM_RATIO, SEED_TARGET_OVER_DRAFT

MODE_LABELS = {"hf_eager": "HF eager", "hf_cuda_graph": "HF in a CUDA graph", "engine": "servelab engine"}


def acceptance(speed: pd.DataFrame, device_name: str):
    """α (maximum-likelihood per-token acceptance) per draft and γ, one panel per temperature."""
    temps = sorted(speed.temperature.unique())
    fig, axes = plt.subplots(1, len(temps), figsize=(min(8.0, 3.9 * len(temps)), 3.6), squeeze=False, sharey=True)
    speed = speed.assign(pair=speed.draft + " → " + speed.target)
    for ax, T in zip(axes[0], temps, strict=True):
        s = speed[speed.temperature == T]
        sns.barplot(data=s, x="gamma", y="alpha", hue="pair", ax=ax)
        ax.set(
            ylim=(0, 1),
            xlabel="γ (draft tokens per round)",
            ylabel="α (per-token acceptance)",
            title=f"temperature {T:g}" + (" (greedy)" if T == 0 else ""),
        )
        ax.legend(fontsize=9, title="draft → target", title_fontsize=9)
    fig.suptitle(f"Acceptance on held-out prompts, {device_name}")
    fig.tight_layout()
    return fig


def speedup_vs_prediction(speed: pd.DataFrame, device_name: str):
    """Left: measured speedup (median, 95% CI) against γ per draft, break-even at 1. Right: measured against the
    Leviathan prediction, with the line of perfect prediction."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.0, 3.8))
    s = speed.copy()
    s["series"] = s.draft + " → " + s.target + ", T=" + s.temperature.map(lambda t: f"{t:g}")
    for (name, grp), color in zip(
        s.groupby("series", sort=False), sns.color_palette(n_colors=s.series.nunique()), strict=True
    ):
        ax1.errorbar(
            grp.gamma.astype(str),
            grp.speedup,
            yerr=[grp.speedup - grp.speedup_ci_low, grp.speedup_ci_high - grp.speedup],
            marker="o",
            capsize=3,
            label=name,
            color=color,
        )
        ax2.scatter(grp.predicted_speedup, grp.speedup, color=color, label=name)
    ax1.axhline(1, color="k", ls=":", label="break-even (no speedup)")
    ax1.set(xlabel="γ", ylabel="speedup over plain decoding (×)", title="measured speedup (median over prompts)")
    ax1.legend(fontsize=6)
    lo = np.nanmin([s.speedup.min(), s.predicted_speedup.min(), 0.5])
    hi = np.nanmax([s.speedup.max(), s.predicted_speedup.max(), 1.5])
    ax2.plot([lo, hi], [lo, hi], "k--", lw=1, label="prediction = measurement")
    ax2.axhline(1, color="k", ls=":", lw=0.8)
    ax2.set(
        xlabel="Leviathan prediction (×), measured α and engine c",
        ylabel="measured speedup (×)",
        title="analytical model against measurement",
    )
    fig.suptitle(f"Speculative decoding in the servelab engine, {device_name}")
    fig.tight_layout()
    return fig


def cost_ratios(ratios: pd.DataFrame, device_name: str):
    """target/draft step time per pair and execution mode, beside the parameter ratio and the seed's 1.18×."""
    r = ratios.copy()
    r["pair"] = r.target + " / " + r.draft
    r["mode_label"] = r["mode"].map(MODE_LABELS).fillna(r["mode"])
    fig, ax = plt.subplots(figsize=(min(8.0, max(6, 1.2 * r.pair.nunique() * r["mode"].nunique())), 4.0))
    sns.barplot(data=r, x="pair", y="target_over_draft", hue="mode_label", ax=ax)
    pairs = list(dict.fromkeys(r.pair))
    for i, p in enumerate(pairs):
        row = r[r.pair == p].iloc[0]
        ax.hlines(
            row.param_ratio, i - 0.4, i + 0.4, colors="k", linestyles="--", label="parameter ratio" if i == 0 else None
        )
        if np.isfinite(row.get("floor_ratio", np.nan)):
            ax.hlines(
                row.floor_ratio,
                i - 0.4,
                i + 0.4,
                colors="tab:green",
                linestyles="-.",
                label="ratio of roofline floors (measured ceilings)" if i == 0 else None,
            )
    ax.axhline(
        SEED_TARGET_OVER_DRAFT,
        color="tab:red",
        ls=":",
        label=f"RTX 2070 (seed): {SEED_TARGET_OVER_DRAFT}× (parameters {SEED_PARAM_RATIO}×)",
    )
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(
        xlabel="",
        ylabel="target / draft decode step time (× = 1/c)",
        title=f"Cost ratio of one batch-1 decode step, {device_name}",
    )
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def pays_map(grid: pd.DataFrame, points: pd.DataFrame, ratios: pd.DataFrame, device_name: str):
    """Best predicted improvement over γ on α × c, the break-even contour, the measured (α, c) of each draft and
    the measured c of the Qwen2 shapes per mode (horizontal lines), and the seed's c."""
    piv = grid.pivot(index="c", columns="alpha", values="improvement")
    A, C = np.meshgrid(piv.columns.to_numpy(), piv.index.to_numpy())
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    levels = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6]
    cs = ax.contourf(A, C, piv.to_numpy(), levels=levels, cmap="RdYlGn", extend="both")
    fig.colorbar(cs, ax=ax, label="best predicted speedup over γ ≤ 8 (×)")
    ax.contour(A, C, piv.to_numpy(), levels=[1], colors="k", linewidths=1.5)
    if len(points):
        for ((d, t), grp), m in zip(points.groupby(["draft", "target"]), "os^Dv<>p", strict=False):
            ax.scatter(grp.alpha, grp.c, marker=m, s=60, edgecolor="k", label=f"{d} → {t} (measured α, engine c)")
    styles = {"hf_eager": ":", "hf_cuda_graph": "-.", "engine": "--"}
    for row in ratios.itertuples():
        ax.axhline(
            row.c,
            color="navy",
            ls=styles.get(row.mode, "-"),
            lw=1,
            label=f"{row.draft} → {row.target}, {MODE_LABELS.get(row.mode, row.mode)}: c = {row.c:.2f}",
        )
    ax.axhline(
        1 / SEED_TARGET_OVER_DRAFT,
        color="tab:red",
        ls=":",
        lw=1.5,
        label=f"RTX 2070 (seed): c = 1/{SEED_TARGET_OVER_DRAFT}",
    )
    ax.set(
        xlabel="α (per-token acceptance)",
        ylabel="c = draft step / target step",
        xlim=(A.min() - 0.02, A.max() + 0.02),
        ylim=(0, C.max()),
        title=f"Where speculation pays (black line: break-even), {device_name}",
    )
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=2)  # below: the map stays visible
    fig.tight_layout()
    return fig


def verify_cost(verify: pd.DataFrame, device_name: str):
    """A target step of n rows (a verify of γ = n − 1 drafts) relative to one decode row."""
    v = verify[verify.status == "ok"].copy()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, grp in v.groupby("model"):
        one = float(grp.loc[grp.rows == grp.rows.min(), "median_ms"].iloc[0])
        ax.errorbar(
            grp.rows,
            grp.median_ms / one,
            yerr=[(grp.median_ms - grp.p25_ms) / one, (grp.p75_ms - grp.median_ms) / one],
            marker="o",
            capsize=3,
            label=name,
        )
    ax.axhline(1, color="k", ls=":", label="the analytical model's assumption")
    ax.set(
        xlabel="rows in the step (γ + 1)",
        ylabel="step time / one-row step",
        title=f"Cost of verifying γ drafts in one step, {device_name}",
    )
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


REAL_ALPHA_COLUMNS = ("pair", "alpha", "ci_low", "ci_high")


def controlled_curves(table: pd.DataFrame, device_name: str, real_alpha: pd.DataFrame | None = None):
    """Speedup at the best γ against the α set, one panel per pair of shapes, one line per batch size (markers:
    median over repeats, bars: min–max; dashed: Leviathan's prediction from the c measured in the loop).

    ``real_alpha`` (columns pair, alpha, ci_low, ci_high): α measured for real trained pairs (Study 6's drafts),
    drawn on every panel as a band, so a reader sees where such a draft would land at these shapes."""
    from servelab.studies.s03_speculative.tables import best_gamma_rows

    best = best_gamma_rows(table)
    pairs = list(dict.fromkeys(best.draft + " → " + best.target))
    fig, axes = plt.subplots(1, len(pairs), figsize=(min(8.0, 2.9 * len(pairs)), 3.6), squeeze=False, sharey=True)
    best = best.assign(pair=best.draft + " → " + best.target)
    for ax, pair in zip(axes[0], pairs, strict=True):
        s = best[best.pair == pair]
        for (b, grp), color in zip(s.groupby("batch"), sns.color_palette(n_colors=s.batch.nunique()), strict=True):
            grp = grp.sort_values("alpha")
            ax.errorbar(
                grp.alpha,
                grp.speedup,
                yerr=[grp.speedup - grp.speedup_low, grp.speedup_high - grp.speedup],
                marker="o",
                capsize=3,
                color=color,
                label=f"batch {b} (best γ)",
            )
            ax.plot(grp.alpha, grp.predicted_speedup, ls="--", color=color, lw=1)
        _real_alpha(ax, real_alpha)
        ax.axhline(1, color="k", ls=":", lw=1)
        ax.set(xlabel="α set (per-token acceptance)", ylabel="speedup over plain decoding (×)", title=pair)
        ax.legend(fontsize=9, title="dashed: prediction", title_fontsize=9)
    fig.suptitle(f"Controlled acceptance at the seed's shapes (random weights), {device_name}")
    fig.tight_layout()
    return fig


def _real_alpha(ax, real_alpha: pd.DataFrame | None) -> None:
    """Bands of measured α (Study 6's trained pairs), where they were given: the place the curves are read at."""
    if real_alpha is None or real_alpha.empty:
        return
    missing = set(REAL_ALPHA_COLUMNS) - set(real_alpha.columns)
    if missing:
        raise ValueError(f"real_alpha needs columns {REAL_ALPHA_COLUMNS}, missing {sorted(missing)}")
    for row, color in zip(real_alpha.itertuples(), sns.color_palette("Greys", len(real_alpha)), strict=True):
        ax.axvspan(row.ci_low, row.ci_high, color=color, alpha=0.3)
        ax.axvline(row.alpha, color=color, lw=1, label=f"measured α: {row.pair}")
