"""The one-pass decode kernel's launch for a device, chosen from committed measurements instead of a per-process timing.

Why: ``triton_decode.tune_triton_decode`` times each of its 12 launches (KEYS x warps x stages) for ~30 ms at one
shape, batch 128 x 1,024 keys, in every process. There the candidates are within a few per cent of each other, so
the pick varies from process to process (Study 1's H200 servers: three launches over 22 processes for Llama-3-8B),
and it is a poor pick where the engine spends its decode steps: on the H100, the launches it picked for the 8B
shape were 1.38x the fastest at batch 1 and 1.45x at batch 8, and for the 0.5B shape 1.25x and 1.29x
(``data/dev/nvidia-h100/2026-12-06/decode_tuning_*.csv``). A repeat's spread then carries the tuner's draw.

What: ``scripts/bench_decode_tuning.py`` times every launch in CUDA graphs at four decode points (batch 1 / 128
keys, 8 / 1,024, 64 / 512, 128 / 1,024), in fresh processes; its rows for a device are committed as
``data/tuning/decode_launch/<device slug>.csv``. ``choose`` takes, per kernel key (query heads per KV head padded,
head_dim, block size), the launch whose time over the points' fastest has the smallest geometric mean (each
launch's time the median over the processes); a launch that failed at any point is not chosen. ``measured_launch``
gives a device's choice, or None where nothing was measured: ``triton_decode.tune_triton_decode`` pins the choice
for the one-pass kernel where the device has measurements (issue 29) and times the candidates itself elsewhere. The
H200's rows come from ``scripts/gpu_dev.sh decode-tuning`` on an H200.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.paths import DATA_DIR

TUNING_DIR = DATA_DIR / "tuning" / "decode_launch"
POINT = ["batch", "context"]
LAUNCH = ["keys", "warps", "stages"]


@dataclass(frozen=True)
class Launch:
    keys: int  # keys per iteration (the kernel's KEYS)
    warps: int
    stages: int
    loss: float  # geometric mean over the points of its time / the fastest launch's time
    worst: float  # its largest time / fastest over the points
    points: int
    processes: int


def groups_pad(heads: int, kv_heads: int) -> int:
    """The kernel key's query rows per KV head, padded as ``triton_decode`` pads them (a power of two, at least 16)."""
    groups = heads // kv_heads
    return max(16, 1 << (groups - 1).bit_length())


def kernel_key(heads: int, kv_heads: int, head_dim: int, block_size: int) -> tuple[int, int, int]:
    return groups_pad(heads, kv_heads), head_dim, block_size


def choose(rows: pd.DataFrame) -> dict[tuple[int, int, int], Launch]:
    """The launch per kernel key from the bench's rows (columns heads, kv_heads, head_dim, block_size, batch,
    context, keys, warps, stages, status, ms, process)."""
    ok = rows[rows["status"] == "ok"].copy()
    ok["key"] = [kernel_key(*r) for r in ok[["heads", "kv_heads", "head_dim", "block_size"]].itertuples(index=False)]
    out = {}
    for key, g in ok.groupby("key", sort=False):
        med = g.groupby([*POINT, *LAUNCH], sort=False)["ms"].median().reset_index()
        med["ratio"] = med["ms"] / med.groupby(POINT)["ms"].transform("min")
        points = med[POINT].drop_duplicates().shape[0]
        per = med.groupby(LAUNCH, sort=False)["ratio"]
        full = per.count() == points  # a launch that failed somewhere is not a candidate
        loss = per.apply(lambda r: math.exp(r.map(math.log).mean()))[full]
        best = loss.sort_values(kind="stable").index[0]
        out[key] = Launch(
            *map(int, best),
            loss=float(loss[best]),
            worst=float(per.max()[best]),
            points=points,
            processes=int(g["process"].nunique()),
        )
    return out


@functools.cache
def _device_table(path: Path) -> dict[tuple[int, int, int], Launch]:
    return choose(pd.read_csv(path)) if path.exists() else {}


def device_slug(device) -> str:
    """The file name a CUDA device's rows are kept under (``measure.device.slugify`` of its name)."""
    import torch

    from servelab.measure.device import slugify

    return slugify(torch.cuda.get_device_name(device))


def measured_launch(device_slug: str, heads: int, kv_heads: int, head_dim: int, block_size: int) -> Launch | None:
    """The committed choice for a device (``measure.device.slugify`` of its name) and a model's attention shape;
    None where the device or the key was not measured."""
    table = _device_table(TUNING_DIR / f"{device_slug}.csv")
    return table.get(kernel_key(heads, kv_heads, head_dim, block_size))
