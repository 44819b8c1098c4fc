"""The decode kernel's launch per device comes from committed timings (``kernels.decode_launch``), not a per-process
draw: the launch with the smallest geometric-mean loss over the decode points, never one that failed somewhere."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
import torch
from interpreted import run_interpreted

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


def test_split_programs_take_the_pinned_launch_with_their_tile_cut_to_the_shortest_chunk(monkeypatch):
    """A split program runs the same kernel over its chunk, so it takes the launch measured for the device; until
    2026-12-07 it kept the fixed 64-key tile at Triton's default warps and stages, which the committed timings put
    at 1.2-1.6x the measured launch's time on both cards."""
    from servelab.kernels import triton_decode

    monkeypatch.setattr(triton_decode, "_PINNED", {})
    monkeypatch.setattr(triton_decode, "_TUNED", {})
    key = triton_decode._key(14, 2, 64, 16, torch.bfloat16)
    assert triton_decode.split_launch(key, 256) == {"KEYS": 64}  # nothing pinned: the fixed tile
    assert triton_decode.split_launch(key, 16) == {"KEYS": 16}
    triton_decode.pin_measured_launch("nvidia-h200", 14, 2, 64, 16, torch.bfloat16)
    assert triton_decode.split_launch(key, 256) == {"KEYS": 128, "num_warps": 4, "num_stages": 2}
    # a chunk shorter than the pinned tile (tests lower min_split_keys) cuts the tile, never below tl.dot's 16 rows
    assert triton_decode.split_launch(key, 40) == {"KEYS": 64, "num_warps": 4, "num_stages": 2}
    assert triton_decode.split_launch(key, 8) == {"KEYS": 16, "num_warps": 4, "num_stages": 2}
    f32 = triton_decode._key(14, 2, 64, 16, torch.float32)  # float32 pools are never pinned: their IEEE dots differ
    assert triton_decode.split_launch(f32, 256) == {"KEYS": 64}


PINNED_SPLIT_CHECK = textwrap.dedent("""
    import torch
    from servelab.kernels import triton_decode
    from servelab.kernels.split_kv import split_decode_reference
    heads, kv, d, bs = 4, 2, 16, 16
    key = triton_decode._key(heads, kv, d, bs, torch.float16)
    triton_decode._PINNED[key] = {"KEYS": 128, "num_warps": 4, "num_stages": 2}
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([700, 300, 1000])
    kp = torch.randn(3 * 64, bs, kv, d, generator=g).half()
    vp = torch.randn(3 * 64, bs, kv, d, generator=g).half()
    tables = torch.randperm(3 * 64, generator=g).view(3, 64)
    q = torch.randn(3, heads, d, generator=g).half()
    assert triton_decode.split_launch(key, 256)["KEYS"] == 128
    got = triton_decode.triton_decode(q, kp, vp, tables, lens, d**-0.5, splits=4, min_split_keys=256)
    want = split_decode_reference(q, kp, vp, tables, lens, d**-0.5, 4, keys=128, min_keys=256)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-3, rtol=2e-3)
    # the launch a bench passes in place of the pinned one (the fixed tile it is timed against) gives the same output
    fixed = triton_decode.triton_decode(
        q, kp, vp, tables, lens, d**-0.5, splits=4, min_split_keys=256, split_launch_kw={"KEYS": 64}
    )
    torch.testing.assert_close(fixed.float(), want.float(), atol=2e-3, rtol=2e-3)
    print("ok")
""")


def test_on_the_cpu_a_split_decode_under_the_pinned_launch_equals_the_reference():
    """The pinned tile (128 keys) over chunks of 256 keys (700 keys: two full chunks and a short one; the fourth split
    of 300 keys empty), under Triton's interpreter: the split-by-split reference's output (the interpreter ignores
    warps and stages; the tile and the chunking are what it checks)."""
    run_interpreted(PINNED_SPLIT_CHECK)
