"""The long-tile kernel's launches (``kernels/triton_long_tiles.py``) against the engine's, on a GPU: is
``default_launch`` still the fastest? Until issue 29 the question was whether ``triton_ragged``'s own long-tile
launch should give way to this kernel; it did, so the ``triton_ragged`` path below is now this kernel at
``default_launch`` (the H100 run that decided it, ``data/dev/nvidia-h100/2026-12-06/long_tiles_949817b.csv``, timed
the old launch).

    python scripts/bench_long_tiles.py --out long_tiles.csv   # Qwen2-0.5B's and Llama-3-8B's attention, bf16
    TRITON_INTERPRET=1 python scripts/bench_long_tiles.py --smoke --out x.csv   # a CPU: does it run? (a test)

One layer's attention over the long tiles of a step, for two steps the step budget measures: a 4096-token prefill
from position 0, and a 512-token chunk after 2,048 cached tokens. The paged pool holds exactly the sequence's
blocks in random order (block size 16), the tile table is padded with empty tiles to the width the step graphs give
it (``ragged.max_long_tiles``). The existing path is ``triton_ragged`` with a ``RaggedTiles`` of long tiles only (an
empty packed table, so it launches the long-tile grid alone); the new one is ``long_tile_attention`` at each point
of a small (keys per iteration, warps, pipeline stages) sweep. Each call is captured in a CUDA graph (as the engine
runs it) and its replays timed with CUDA events (``measure.time_fn``: warm-up, median and quartiles over
``--repeats``). One layer's K/V stays in L2 from replay to replay, as it nearly does in a step that has just
written it; the kernels are compute-bound at these shapes (the step budget has them at 8x their FLOP floor).

The floor is causal attention's FLOPs (4 · head_dim per visible (query, key) pair and head: QK^T and PV) over the
bf16 matmul rate measured in the same run (``measure.ceilings``). ``max_abs_diff`` is each output's largest
difference from the existing kernel's, ``max_abs_diff_fp32`` from ``ragged_reference`` in float32 on the same bf16
inputs. Writes one row per (shape, case, path, launch) and the device record beside the CSV
(``<out>.device.json``). Development data, not a book figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servelab.kernels.ragged import (  # noqa: E402
    RaggedTiles,
    max_long_tiles,
    plan_tiles,
    ragged_long_tile_tokens,
    ragged_reference,
    ragged_tile_tokens,
)
from servelab.kernels.split_kv import head_pad  # noqa: E402
from servelab.kernels.triton_long_tiles import long_tile_attention  # noqa: E402
from servelab.kernels.triton_ragged import KEYS_PER_ITER, triton_ragged  # noqa: E402
from servelab.measure import time_fn  # noqa: E402
from servelab.measure.bench_rows import error_fields, show  # noqa: E402
from servelab.measure.ceilings import measure_ceilings  # noqa: E402
from servelab.measure.device import device_record  # noqa: E402

SHAPES = {"qwen2-0.5b": (14, 2, 64), "llama-3-8b": (32, 8, 128)}  # query heads, KV heads, head_dim
CASES = {"prefill-4096": (4096, 0), "chunk-512-after-2048": (512, 2048)}  # tokens, first position
SWEEP = [(64, 4, 3), (64, 8, 3), (64, 8, 4), (128, 8, 2), (128, 8, 3), (32, 4, 3)]  # keys/iteration, warps, stages
BLOCK_SIZE = 16
# --smoke, on a CPU under the interpreter: 16-token long tiles, 16 keys per iteration for triton_ragged
SMOKE_SHAPES = {"tiny": (4, 2, 16)}
SMOKE_CASES = {"prefill-40": (40, 0), "chunk-20-after-30": (20, 30)}
SMOKE_SWEEP = [(16, 4, 1), (32, 4, 1)]


def causal_flops(heads: int, head_dim: int, tokens: int, pos0: int) -> int:
    """QK^T and PV over every visible (query, key) pair: token at position p sees p + 1 keys."""
    pairs = tokens * pos0 + tokens * (tokens + 1) // 2
    return 4 * head_dim * heads * pairs


def build_case(heads, kv_heads, d, tokens, pos0, long_tokens, dtype, device, seed=0):
    """q, pools holding exactly the sequence's blocks (random order), its block table and the long-tile table."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = -(-(pos0 + tokens) // BLOCK_SIZE)
    kp = torch.randn(blocks, BLOCK_SIZE, kv_heads, d, generator=g, device=device).to(dtype)
    vp = torch.randn(blocks, BLOCK_SIZE, kv_heads, d, generator=g, device=device).to(dtype)
    tables = torch.randperm(blocks, generator=g, device=device)[None, :]
    q = torch.randn(tokens, heads, d, generator=g, device=device).to(dtype)
    _, long = plan_tiles([(0, 0, tokens, pos0)], ragged_tile_tokens(heads, kv_heads), long_tokens)
    tiles = torch.zeros(4, max_long_tiles(tokens, long_tokens), dtype=torch.long)
    tiles[:, : len(long)] = torch.tensor(long).t()
    return q, kp, vp, tables, tiles.to(device)


def timed(call, device, repeats: int):
    """(timing, output) of ``call``: replays of a CUDA graph around it on a GPU, plain calls on a CPU."""
    out = call()  # compiles (or interprets) once, outside any graph
    if device.type != "cuda":
        return time_fn(call, warmup=1, repeats=repeats, device=device), out
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return time_fn(graph.replay, warmup=5, repeats=repeats, device=device), out


def bench_case(shape: str, case: str, args, device, dtype, tflop_s: float) -> list[dict]:
    heads, kv_heads, d = args.shape_table[shape]
    tokens, pos0 = args.case_table[case]
    long_tokens = args.long_tile_tokens or ragged_long_tile_tokens(d)
    q, kp, vp, tables, tiles = build_case(heads, kv_heads, d, tokens, pos0, long_tokens, dtype, device)
    packed = torch.zeros(4, 0, dtype=torch.long, device=device)  # no packed tile: the long-tile launch alone
    rt = RaggedTiles(packed, tables, ragged_tile_tokens(heads, kv_heads), tiles, long_tokens)
    scale = d**-0.5
    want = ragged_reference(q.float(), kp.float(), vp.float(), rt, scale)
    flops = causal_flops(heads, d, tokens, pos0)
    floor_ms = flops / (tflop_s * 1e12) * 1e3
    common = dict(shape=shape, case=case, tokens=tokens, pos0=pos0, long_tile_tokens=long_tokens, floor_ms=floor_ms)
    existing_warps = 4 if head_pad(d) * long_tokens <= 64 * 128 else 8  # triton_ragged's choice for long tiles
    existing = lambda: triton_ragged(q, kp, vp, rt, scale, keys=args.keys)  # noqa: E731
    paths = [("triton_ragged", (args.keys, existing_warps, 3), existing)]
    for block_n, warps, stages in args.sweep:
        call = lambda b=block_n, w=warps, s=stages: long_tile_attention(  # noqa: E731
            q, kp, vp, tiles, tables, long_tokens, scale, block_n=b, num_warps=w, num_stages=s
        )
        paths.append(("long_tile_attention", (block_n, warps, stages), call))
    rows, base_out, base_ms = [], None, None
    for path, (block_n, warps, stages), call in paths:
        row = common | dict(path=path, block_n=block_n, num_warps=warps, num_stages=stages, status="ok")
        try:
            t, out = timed(call, device, args.repeats)
            out = out.float()
            if base_out is None:
                base_out, base_ms = out, t.median_ms
            row |= dict(ms=t.median_ms, p25_ms=t.p25_ms, p75_ms=t.p75_ms, repeats=t.repeats)
            row |= dict(times_floor=t.median_ms / floor_ms, tflop_s=flops / (t.median_ms * 1e-3) / 1e12)
            row |= dict(speedup=base_ms / t.median_ms, max_abs_diff=float((out - base_out).abs().max()))
            row["max_abs_diff_fp32"] = float((out - want).abs().max())
        except Exception as e:  # noqa: BLE001 - a launch that fails (e.g. out of shared memory) is a row
            row |= error_fields(e)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        show(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="long_tiles.csv")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--keys", type=int, default=KEYS_PER_ITER, help="triton_ragged's keys per iteration")
    p.add_argument("--long-tile-tokens", type=int, default=0, help="0: the engine's, ragged_long_tile_tokens(d)")
    p.add_argument("--smoke", action="store_true", help="on a CPU under TRITON_INTERPRET=1: a tiny shape, float32")
    args = p.parse_args(argv)
    args.sweep, args.shape_table, args.case_table = SWEEP, SHAPES, CASES
    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        args.shape_table, args.case_table = SMOKE_SHAPES, SMOKE_CASES
        args.shapes, args.cases, args.sweep = list(SMOKE_SHAPES), list(SMOKE_CASES), SMOKE_SWEEP
        args.repeats, args.keys, args.long_tile_tokens = 2, 16, 16
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke under TRITON_INTERPRET=1 on a CPU")
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
    record = device_record(device)
    ceilings = measure_ceilings(device, copy_mib=8 if args.smoke else None, matmul_n=64 if args.smoke else None)
    print(f"matmul {ceilings.matmul_tflop_s:.4g} TFLOP/s ({ceilings.matmul_dtype})", flush=True)
    rows = []
    for shape in args.shapes:
        for case in args.cases:
            rows += bench_case(shape, case, args, device, dtype, ceilings.matmul_tflop_s)
    table = pd.DataFrame(rows)
    out = Path(args.out)
    table.to_csv(out, index=False)
    meta = {"device": record.close().as_dict(), "ceilings": ceilings.as_dict()}
    out.with_suffix(".device.json").write_text(json.dumps(meta, indent=1, default=str))
    cols = ["shape", "case", "path", "block_n", "num_warps", "num_stages", "ms", "floor_ms", "times_floor", "speedup"]
    cols += ["max_abs_diff", "max_abs_diff_fp32", "status"]
    with pd.option_context("display.width", 220, "display.max_columns", 20):
        print(record.summary())
        print(table[[c for c in cols if c in table]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
