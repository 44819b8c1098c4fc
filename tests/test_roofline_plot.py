"""The roofline plot puts each point at (FLOPs/bytes, FLOPs/time) and draws both measured ceilings."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.studies.common.roofline_plot import COPY_LABEL, MATMUL_LABEL, roofline_plot, roofline_points

P, B = 500.0, 4000.0  # TFLOP/s, GB/s: ridge at 125 FLOP/byte


def _points():
    return pd.DataFrame(
        {
            "flops": [1e9, 4e12, 2e12],
            "bytes": [1e9, 1e9, 0.0],  # the last has no bytes: not on a log-log plot
            "ms": [2.0, 10.0, 1.0],
            "label": ["decode", "prefill", "prefill"],
        }
    )


def test_points_land_at_intensity_and_achieved_rate():
    fig = roofline_plot(_points(), P, B)
    ax = fig.axes[0]
    offsets = {c.get_label(): c.get_offsets() for c in ax.collections}
    # 1e9 FLOP over 1e9 B = 1 FLOP/byte; 1e9 FLOP in 2 ms = 0.5 TFLOP/s
    np.testing.assert_allclose(offsets["decode"], [[1.0, 0.5]])
    # 4e12 FLOP over 1e9 B = 4000 FLOP/byte; in 10 ms = 400 TFLOP/s
    np.testing.assert_allclose(offsets["prefill"], [[4000.0, 400.0]])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    plt.close(fig)


def test_both_ceilings_are_drawn_and_meet_at_the_ridge():
    fig = roofline_plot(_points(), P, B)
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines() if ln.get_gid()}
    copy, flat = lines[COPY_LABEL], lines[MATMUL_LABEL]
    cx, cy = copy.get_data()
    np.testing.assert_allclose(np.asarray(cy) / np.asarray(cx), B * 1e9 / 1e12)  # slope: B in TFLOP/s per FLOP/B
    fx, fy = flat.get_data()
    np.testing.assert_allclose(fy, [P, P])
    assert cx[-1] == pytest.approx(fx[0]) == pytest.approx(P * 1e12 / (B * 1e9))  # ridge, 125 FLOP/byte
    assert "4,000 GB/s" in copy.get_label() and "500 TFLOP/s" in flat.get_label()
    plt.close(fig)


def test_seconds_column_and_dropped_rows():
    d = _points().drop(columns="ms").assign(seconds=[2e-3, 10e-3, 1e-3])
    r = roofline_points(d)
    assert len(r) == 2
    np.testing.assert_allclose(r["tflop_s"], [0.5, 400.0])


def test_bad_input_is_refused():
    with pytest.raises(ParameterError, match="flops"):
        roofline_points(pd.DataFrame({"bytes": [1], "ms": [1]}))
    with pytest.raises(ParameterError, match="positive"):
        roofline_plot(_points(), 0.0, B)
    with pytest.raises(ParameterError, match="'kernel'"):
        roofline_plot(_points(), P, B, label="kernel")


def test_small_ceilings_keep_their_digits():
    fig = roofline_plot(_points(), 0.0912, 17.4)
    labels = [ln.get_label() for ln in fig.axes[0].get_lines() if ln.get_gid()]
    assert labels == [f"{COPY_LABEL}, 17.4 GB/s", f"{MATMUL_LABEL}, 0.0912 TFLOP/s"]
    plt.close(fig)
