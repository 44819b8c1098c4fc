"""The decode kernel's launch per device comes from committed timings (``kernels.decode_launch``), not a per-process
draw: the launch with the smallest geometric-mean loss over the decode points, never one that failed somewhere."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from servelab.kernels.decode_launch import TUNING_DIR, choose, groups_pad, kernel_key, measured_launch
from servelab.kernels.triton_decode import _groups_pad


def _rows(times: dict[tuple, list[float]], status=None) -> pd.DataFrame:
    """Rows of one kernel key: ``times[(keys, warps, stages)]`` is its ms at each of the points, per process."""
    points = [(1, 128), (8, 1024), (64, 512)]
    rows = []
    for (keys, warps, stages), per_point in times.items():
        for (batch, context), ms in zip(points, per_point, strict=True):
            for process, jitter in enumerate((0.0, 0.001, -0.001)):
                bad = status is not None and status == (keys, warps, stages, batch)
                rows.append(
                    dict(process=process, heads=14, kv_heads=2, head_dim=64, block_size=16, batch=batch,
                         context=context, keys=keys, warps=warps, stages=stages,
                         status="OutOfResources" if bad else "ok", ms=float("nan") if bad else ms + jitter)
                )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_launch_with_the_smallest_geometric_mean_loss_wins_not_the_best_at_one_point():
    # (128,2,3) is fastest at the largest point alone (what a tuner timing only there would pick) and slow elsewhere
    rows = _rows({(128, 2, 3): [2.0, 2.0, 0.99], (128, 4, 2): [1.0, 1.0, 1.0], (64, 4, 2): [1.1, 1.0, 1.05]})
    got = choose(rows)[(16, 64, 16)]
    assert (got.keys, got.warps, got.stages) == (128, 4, 2)
    assert got.loss == pytest.approx((1.0 * 1.0 * (1.0 / 0.99)) ** (1 / 3), rel=1e-3)
    assert got.points == 3 and got.processes == 3


def test_a_launch_that_failed_at_any_point_is_not_chosen():
    rows = _rows({(128, 4, 2): [1.0, 1.0, 1.0], (64, 4, 2): [1.1, 1.1, 1.1]}, status=(128, 4, 2, 64))
    got = choose(rows)[(16, 64, 16)]
    assert (got.keys, got.warps, got.stages) == (64, 4, 2)


def test_the_key_pads_query_groups_as_the_kernel_does():
    for heads, kv in ((14, 2), (32, 8), (64, 2), (12, 12), (40, 1)):
        assert groups_pad(heads, kv) == _groups_pad(heads // kv)
    assert kernel_key(32, 8, 128, 16) == (16, 128, 16)


def test_the_h100s_committed_timings_choose_keys_128_with_4_warps_and_2_stages_for_both_model_shapes():
    for heads, kv, d in ((14, 2, 64), (32, 8, 128)):
        got = measured_launch("nvidia-h100-80gb-hbm3", heads, kv, d, 16)
        assert (got.keys, got.warps, got.stages) == (128, 4, 2) and got.worst < 1.1 and got.processes == 3
    assert measured_launch("nvidia-h100-80gb-hbm3", 14, 2, 80, 16) is None  # a head size it did not measure
    assert measured_launch("a-device-never-measured", 14, 2, 64, 16) is None
    assert (TUNING_DIR / "nvidia-h100-80gb-hbm3.csv").exists()


def test_the_engine_pins_a_measured_devices_launch_and_tunes_elsewhere(monkeypatch):
    """``triton_decode`` launches the pinned launch for a measured device's kernel key; a device or shape without
    measurements pins nothing (the per-process tuner then times the candidates, as before)."""
    from servelab.kernels import triton_decode

    monkeypatch.setattr(triton_decode, "_PINNED", {})
    monkeypatch.setattr(triton_decode, "_TUNED", {})
    got = triton_decode.pin_measured_launch("nvidia-h200", 14, 2, 64, 16, torch.bfloat16)
    assert got == "KEYS=128, warps=4, stages=2 (measured: data/tuning/decode_launch/nvidia-h200.csv)"
    key = triton_decode._key(14, 2, 64, 16, torch.bfloat16)
    assert triton_decode._PINNED[key] == {"KEYS": 128, "num_warps": 4, "num_stages": 2}
    assert triton_decode._TUNED[key] == got  # what the engine's stats report as its launch
    assert triton_decode.pin_measured_launch("a-device-never-measured", 14, 2, 64, 16, torch.bfloat16) is None
    assert triton_decode.pin_measured_launch("nvidia-h200", 14, 2, 80, 16, torch.bfloat16) is None
    assert len(triton_decode._PINNED) == 1
