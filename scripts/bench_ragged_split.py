"""One layer's ragged attention on the GPU, single-pass vs split-KV, for mixed steps with and without a long context.

Qwen2-0.5B's attention (14 heads, 2 KV heads, head_dim 64), bf16, block size 16. Each case is one step's tiles
(``ragged.plan_tiles``; with split-KV, ``ragged.plan_splits`` within ``ragged.split_budget`` columns for a 16K
table, as ``engine/step_graphs.py`` plans them), ten kernel calls captured in one CUDA graph so Python's launch
cost is out of the timing, timed with CUDA events: the median of 30 replays, in µs per call.
"Short" cases show what the split columns cost when they are empty or barely used.

    python scripts/bench_ragged_split.py
"""

from __future__ import annotations

import statistics

import torch

from servelab.kernels.ragged import (
    RaggedTiles,
    max_long_tiles,
    max_tiles,
    plan_splits,
    plan_tiles,
    ragged_long_tile_tokens,
    ragged_tile_tokens,
    split_budget,
)
from servelab.kernels.triton_decode import sm_count
from servelab.kernels.triton_ragged import triton_ragged

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 14, 2, 64, 16
CASES = {
    "63 decodes at 128 + a 512 chunk (short)": [(1, 127)] * 63 + [(512, 0)],
    "63 decodes at 512 + a 512 chunk": [(1, 511)] * 63 + [(512, 0)],
    "1 decode at 16K + a 512 chunk": [(1, 16383), (512, 0)],
    "1 decode at 16K + 62 at 512 + a 512 chunk": [(1, 16383)] + [(1, 511)] * 62 + [(512, 0)],
    "1 decode at 16K alone": [(1, 16383)],
    "4 decodes at 4K + a 512 chunk": [(1, 4095)] * 4 + [(512, 0)],
}


def table(cols: list, rows: int, width: int) -> torch.Tensor:
    t = torch.zeros(rows, max(width, 1), dtype=torch.long)
    if cols:
        t[:, : len(cols)] = torch.tensor(cols).t()
    return t.cuda()


def step(runs, budget: int):
    """(q, pools, tiles) of one step over its own random pool; ``budget`` 0: no split columns."""
    width = -(-max(n + p for n, p in runs) // BLOCK)
    blocks = width * len(runs)
    kp = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    tables = torch.randperm(blocks, device="cuda").view(len(runs), width)
    spans, start = [], 0
    for row, (n, pos) in enumerate(runs):
        spans.append((row, start, n, pos))
        start += n
    tt, lt = ragged_tile_tokens(HEADS, KV_HEADS), ragged_long_tile_tokens(HEAD_DIM)
    packed, long = plan_tiles(spans, tt, lt)
    packed, split = plan_splits(packed, budget, KV_HEADS, sm_count("cuda"))
    rt = RaggedTiles(
        table(packed, 4, max_tiles(start, len(runs), tt)), tables, tt, table(long, 4, max_long_tiles(start, lt)), lt
    )
    if budget:
        rt.split_tiles = table(split, 6, budget)
        rt.split_counters = torch.zeros(budget * KV_HEADS, dtype=torch.int32, device="cuda")
    q = torch.randn(start, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return q, kp, vp, rt, len(split)


def time_us(runs, budget: int) -> tuple[float, int]:
    q, kp, vp, rt, used = step(runs, budget)
    for _ in range(3):
        triton_ragged(q, kp, vp, rt, HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            triton_ragged(q, kp, vp, rt, HEAD_DIM**-0.5)
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 100)  # ms per 10 calls -> µs per call
    return statistics.median(times), used


def main() -> None:
    budget = split_budget(KV_HEADS, 16384, sm_count("cuda"))
    print(f"{torch.cuda.get_device_name()}: split budget {budget} columns; µs per layer call, median of 30")
    for name, runs in CASES.items():
        single, _ = time_us(runs, 0)
        split, used = time_us(runs, budget)
        print(f"{name:45s} single-pass {single:8.1f}  split-KV {split:8.1f}  ({used} columns used)")


if __name__ == "__main__":
    main()
