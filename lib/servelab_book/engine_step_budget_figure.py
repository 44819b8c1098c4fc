"""The engine page's step-budget figure: per step kind, a stacked bar of where the profiled step's time went beside a
stacked bar of each class's floor, written as SVG text with the book's style (``servelab.studies.common.style``).

One panel per step kind, each with its own scale: a 4096-token prefill is ten times a batch-1 decode, and on a common
axis the decode bars would be slivers. The measured bar holds each class's kernel time, the GPU's idle gaps inside
the captured graph and outside it (waiting for the host's next launch), and the host's time with no kernel of the
step running; it adds up to the synchronised call under the profiler. The floor bar holds each class's floor.
"""

from __future__ import annotations

import io

import pandas as pd

from servelab.bench.kernel_classes import CLASSES, LABELS
from servelab.studies.common.style import OKABE_ITO, RC

CLASS_COLOURS = {
    "gemm": OKABE_ITO["blue"],
    "attention": OKABE_ITO["orange"],
    "norm_elementwise": OKABE_ITO["green"],
    "sampling": OKABE_ITO["purple"],
    "copies": OKABE_ITO["sky"],
    "other": OKABE_ITO["grey"],
}
# time that is no class's: pale, and hatched inside the graph, so that it reads as a gap and not as one more kind of
# work (a dotted hatch would cost the SVG a circle per dot)
GAPS = {
    "graph_idle": ("GPU idle inside the graph", "white", "////"),
    "other_idle": ("GPU idle outside the graph", "#E8E8E8", ""),
    "host": ("host, no kernel running", OKABE_ITO["vermillion"], ""),
}
LEGEND_IN = 0.8  # inches below the panels for the legend's three rows


def measured_parts(step: pd.DataFrame) -> dict[str, float]:
    """The measured bar of one step kind (its rows, one per class): ms per class, then its gaps."""
    first = step.iloc[0]
    busy = step.set_index("class").busy_ms.reindex(CLASSES).fillna(0.0)
    graph_idle = 0.0 if pd.isna(first.graph_idle_ms) else float(first.graph_idle_ms)
    return {
        **busy.to_dict(),
        "graph_idle": graph_idle,
        "other_idle": max(float(first.idle_gap_ms) - graph_idle, 0.0),
        "host": float(first.host_ms),
    }


def floor_parts(step: pd.DataFrame) -> dict[str, float]:
    return step.set_index("class").floor_ms.reindex(CLASSES).fillna(0.0).to_dict()


def figure_svg(budget: pd.DataFrame, labels: dict[str, str], device_name: str) -> str:
    """The figure as SVG text, the same bytes for the same table (no date, a fixed hash salt)."""
    import matplotlib as mpl

    with mpl.rc_context(RC | {"svg.hashsalt": "servelab-step-budget"}):
        fig = step_budget_figure(budget, labels, device_name)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def step_budget_figure(budget: pd.DataFrame, labels: dict[str, str], device_name: str):
    """One panel per step kind (``labels``: step -> its title, in order), measured above floor (a matplotlib
    ``Figure``, not registered with pyplot, so building the book leaves no global figure state)."""
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    with mpl.rc_context(RC):
        fig = Figure(figsize=(7.5, 1.25 * len(labels) + 0.5 + LEGEND_IN))
        axes = fig.subplots(len(labels), 1, squeeze=False)[:, 0]
        for ax, (step, title) in zip(axes, labels.items(), strict=True):
            _panel(ax, budget[budget.step == step], title)
        axes[-1].set_xlabel("ms")
        handles = [Patch(color=CLASS_COLOURS[c], label=LABELS[c]) for c in CLASSES] + [
            Patch(facecolor=colour, edgecolor=OKABE_ITO["grey"], hatch=hatch, label=label)
            for label, colour, hatch in GAPS.values()
        ]
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0))
        fig.suptitle(f"Where one engine step's time goes, {device_name}")
        fig.tight_layout(rect=(0, LEGEND_IN / fig.get_figheight(), 1, 1))
    return fig


def _panel(ax, step: pd.DataFrame, title: str) -> None:
    """Two stacked bars: the measured step (top) and its floor (bottom)."""
    left = 0.0
    for part, ms in measured_parts(step).items():
        if part in CLASS_COLOURS:
            ax.barh(1, ms, left=left, color=CLASS_COLOURS[part], height=0.6)
        else:
            _, colour, hatch = GAPS[part]
            ax.barh(1, ms, left=left, color=colour, hatch=hatch, edgecolor=OKABE_ITO["grey"], lw=0.5, height=0.6)
        left += ms
    left = 0.0
    for part, ms in floor_parts(step).items():
        ax.barh(0, ms, left=left, color=CLASS_COLOURS[part], height=0.6)
        left += ms
    ax.set_yticks([1, 0], ["measured", "floor"])
    ax.set_ylim(-0.6, 1.6)
    ax.grid(axis="y", visible=False)
    ax.set_title(title, fontsize=9, loc="left")
