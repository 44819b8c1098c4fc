"""The controlled-acceptance page's figure: measured and predicted speedup against the α set, one panel per pair
and batch size, one colour per γ, written as SVG text with the book's style (``servelab.studies.common.style``).

Study 3's own ``plots.controlled_curves`` draws only the best γ per batch; this page shows every γ, so a reader sees
where each γ overtakes the others and how far the prediction (dashed) lies above the measurement.
"""

from __future__ import annotations

import io
import math

import pandas as pd

from servelab.studies.common.style import OKABE_ITO, RC, color
from servelab.studies.s03_speculative import report

GAMMA_COLOURS = ("orange", "sky", "green", "blue", "vermillion", "purple", "brown", "teal")  # Okabe–Ito, by γ


def figure_svg(table: pd.DataFrame, device_name: str) -> str:
    """The controlled curves as SVG text, the same bytes for the same table (no date, a fixed hash salt)."""
    import matplotlib as mpl

    with mpl.rc_context(RC | {"svg.hashsalt": "servelab-controlled"}):
        fig = controlled_figure(table, device_name)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def controlled_figure(table: pd.DataFrame, device_name: str):
    """One panel per (pair, batch): measured and predicted speedup against α, one colour per γ (a matplotlib
    ``Figure``, not registered with pyplot, so building the book leaves no global figure state)."""
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    panels = list(table.groupby(["target", "draft", "batch"], sort=False))
    gammas = sorted(int(g) for g in table.gamma.unique())
    colours = {g: OKABE_ITO[GAMMA_COLOURS[i % len(GAMMA_COLOURS)]] for i, g in enumerate(gammas)}  # same in every panel
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    with mpl.rc_context(RC):
        fig = Figure(figsize=(4.2 * cols, 3.4 * rows + 0.6))
        axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
        for ax, ((t, d, b), grp) in zip(axes.flat, panels, strict=False):
            _panel(ax, grp, f"{d} → {t}, batch {b}", colours)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        handles = [Line2D([], [], marker="o", ms=4, color=colours[g]) for g in gammas] + [
            Line2D([], [], ls="--", lw=1, color=color("seed")),
            Line2D([], [], marker="*", ms=10, ls="none", color=color("model")),
        ]
        labels = [f"γ = {g}" for g in gammas] + [
            "prediction (dashed)",
            f"goal: {report.GOAL_SPEEDUP:g}× at α = {report.GOAL_ALPHA:g}, batch 1",
        ]
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, 0))
        fig.suptitle(f"Controlled acceptance at the seed's shapes (random weights), {device_name}")
        fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def _panel(ax, grp: pd.DataFrame, title: str, colours: dict[int, str]) -> None:
    """Measured (markers, min–max bars) and predicted (dashed) speedup against α, one colour per γ."""
    for g, s in grp.groupby("gamma"):
        s = s.sort_values("alpha")
        c = colours[int(g)]
        ax.errorbar(
            s.alpha,
            s.speedup,
            yerr=[s.speedup - s.speedup_low, s.speedup_high - s.speedup],
            marker="o",
            ms=4,
            capsize=2,
            lw=1.2,
            color=c,
        )
        ax.plot(s.alpha, s.predicted_speedup, ls="--", lw=1, color=c)
    ax.axhline(1, color=color("ceiling"), ls=":", lw=1)
    if report.goal_check(grp) is not None:  # the panel holding the goal's point
        ax.plot([report.GOAL_ALPHA], [report.GOAL_SPEEDUP], marker="*", ms=12, color=color("model"), ls="none")
    ax.set(xlabel="α set (per-token acceptance)", ylabel="speedup (×)", title=title)
    ax.title.set_fontsize(9)
