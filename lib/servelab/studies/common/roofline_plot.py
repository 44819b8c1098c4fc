"""The roofline plot: arithmetic intensity (FLOP/byte) on x, achieved TFLOP/s on y, both measured ceilings drawn.

A point at intensity I = FLOPs / bytes cannot rise above min(P, B·I): the copy-bandwidth slope B·I (B in bytes/s)
left of the ridge I* = P / B, the matmul flat P right of it. Both ceilings are the run's *measured* ones
(``servelab.measure.Ceilings``), so a point above a line is a measurement that beat a measured ceiling, and the
plot shows it rather than hiding it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.studies.common.style import OKABE_ITO, color

COPY_LABEL = "copy ceiling"
MATMUL_LABEL = "matmul ceiling"


def roofline_points(points: pd.DataFrame, *, ms: str = "ms") -> pd.DataFrame:
    """``points`` with ``intensity`` (FLOP/byte) and ``tflop_s`` (achieved TFLOP/s) from ``flops``, ``bytes`` and
    the time column ``ms`` (milliseconds; a ``seconds`` column is used when ``ms`` is absent). Rows without a
    positive time, FLOP count or byte count are dropped: they have no place on a log-log plot."""
    missing = [c for c in ("flops", "bytes") if c not in points.columns]
    if ms in points.columns:
        seconds = points[ms].astype(float) * 1e-3
    elif "seconds" in points.columns:
        seconds = points["seconds"].astype(float)
    else:
        missing.append(f"{ms} or seconds")
    if missing:
        raise ParameterError(f"roofline points need columns {missing}; they have {list(points.columns)}")
    out = points.assign(
        intensity=points["flops"].astype(float) / points["bytes"].astype(float),
        tflop_s=points["flops"].astype(float) / seconds / 1e12,
    )
    keep = (seconds > 0) & (out["flops"].astype(float) > 0) & (out["bytes"].astype(float) > 0)
    return out[keep.to_numpy()]


def _rate(x: float) -> str:
    """A ceiling for a legend: whole units from 100 up (4,273), three significant figures below (0.0912, on a CPU)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _colour(name: str, i: int) -> str:
    """The book's colour for a named kernel or mode; otherwise the Okabe–Ito set in order."""
    try:
        return color(name)
    except ParameterError:
        cycle = [c for k, c in OKABE_ITO.items() if k not in ("black", "grey")]
        return cycle[i % len(cycle)]


def _draw_ceilings(ax, x_lo: float, x_hi: float, matmul_tflop_s: float, copy_gb_s: float) -> None:
    """The copy slope up to the ridge, the matmul flat from it, each a separate labelled line."""
    ridge = matmul_tflop_s * 1e12 / (copy_gb_s * 1e9)  # FLOP/byte where the two ceilings meet
    lo, hi = min(x_lo, ridge / 10), max(x_hi, ridge * 10)
    slope_x = np.array([lo, ridge])
    ax.plot(
        slope_x,
        slope_x * copy_gb_s * 1e9 / 1e12,
        color=color("ceiling"),
        ls="--",
        lw=1.5,
        label=f"{COPY_LABEL}, {_rate(copy_gb_s)} GB/s",
        gid=COPY_LABEL,
    )
    ax.plot(
        [ridge, hi],
        [matmul_tflop_s, matmul_tflop_s],
        color=color("ceiling"),
        ls="-",
        lw=1.5,
        label=f"{MATMUL_LABEL}, {_rate(matmul_tflop_s)} TFLOP/s",
        gid=MATMUL_LABEL,
    )
    ax.axvline(ridge, color=color("ceiling"), lw=0.6, alpha=0.4)


def roofline_plot(
    points: pd.DataFrame,
    matmul_tflop_s: float,
    copy_gb_s: float,
    *,
    label: str = "label",
    ms: str = "ms",
    title: str = "",
    ax=None,
):
    """Log-log roofline: one marker colour per ``label`` value, both measured ceilings drawn (TFLOP/s, GB/s).

    ``points`` has columns ``flops``, ``bytes``, ``label`` and a time (``ms`` in milliseconds, or ``seconds``).
    Returns the figure; the legend sits outside the axes so that it hides no point."""
    if not (matmul_tflop_s > 0 and copy_gb_s > 0):
        raise ParameterError(f"ceilings must be positive: matmul {matmul_tflop_s} TFLOP/s, copy {copy_gb_s} GB/s")
    if label not in points.columns:
        raise ParameterError(f"roofline points need a {label!r} column; they have {list(points.columns)}")
    d = roofline_points(points, ms=ms)
    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.figure
    for i, (name, g) in enumerate(d.groupby(label, sort=True)):
        ax.scatter(g["intensity"], g["tflop_s"], s=22, color=_colour(str(name), i), label=str(name), zorder=3)
    x = d["intensity"] if len(d) else pd.Series([1.0])
    _draw_ceilings(ax, float(x.min()) / 2, float(x.max()) * 2, matmul_tflop_s, copy_gb_s)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
