"""Decode attention alone, on the GPU: one pass vs split-KV vs gather, against the memory floor.

One "step" is ``--layers`` decode-attention calls, each over a pool of its own (as a model's layers read
their own KV cache, so nothing is served from L2 that a real step would read from HBM), captured in one CUDA
graph so Python's launch cost is out of the timing; timed with CUDA events over replays, median of repeats.
The floor is the step's K/V bytes over the device-to-device copy bandwidth measured here first.

    python scripts/bench_decode_kernel.py                 # Qwen2-0.5B's attention: 14 heads, 2 KV heads, d 64
    python scripts/bench_decode_kernel.py --head-dim 80   # a head size that is not a power of two

Prints one line per (batch, context, path): ms per step, the splits the kernel chose, and the floor.

    python scripts/bench_decode_kernel.py --sweep-splits --out decode_splits.csv

times the one-pass and split-KV kernel at forced splits (1, 2, 3, 4, 6, 8, 16, and each rule's pick) over a grid
of batches and contexts, beside the splits ``decode_splits`` gives a decode graph captured at the engine's full
block-table width (``--engine-width`` keys, 4,096 by default: the engine's default max_model_len) and at the context
itself: whether the engine's split choice is the fastest where decode graphs run (at batch 64 and 512 keys one pass
took 0.301 ms and 2 splits 0.329 on an H100, 2026-12-06).
"""

from __future__ import annotations

import argparse
import functools
import statistics

import pandas as pd
import torch

from servelab.kernels.decode import gather_decode
from servelab.kernels.split_kv import decode_splits
from servelab.kernels.triton_decode import KEYS_PER_ITER, sm_count, triton_decode, tune_triton_decode

POINTS = ((1, 128), (1, 16384), (64, 512))
SWEEP_BATCHES = (1, 8, 16, 32, 64, 128)
SWEEP_CONTEXTS = (512, 1024, 2048, 4096)
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 16)


def copy_gb_s(device) -> float:
    """Device-to-device copy bandwidth, bytes read + written, GB/s (1 GiB buffers, median of 5)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * a.numel() / statistics.median(times) / 1e9


def step_ms(call, replays: int = 50, repeats: int = 5) -> float:
    """Median ms of one replay of ``call`` captured in a CUDA graph."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return statistics.median(times)


def floor_ms(args, batch: int, context: int, gb_s: float) -> float:
    """A step's K and V bytes (bf16, every layer) over the measured copy bandwidth, ms."""
    kv_bytes = args.layers * 2 * batch * context * args.kv_heads * args.head_dim * 2
    return kv_bytes / (gb_s * 1e9) * 1e3


def case(args, batch: int, context: int, device):
    """Per layer: a pool holding exactly the batch's keys (blocks in random order), tables and lengths."""
    g = torch.Generator(device=device).manual_seed(0)
    per_seq = -(-context // args.block_size)
    layers = []
    for _ in range(args.layers):
        shape = (batch * per_seq, args.block_size, args.kv_heads, args.head_dim)
        k = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        tables = torch.randperm(batch * per_seq, device=device, generator=g).view(batch, per_seq)
        layers.append((k, v, tables))
    lens = torch.full((batch,), context, dtype=torch.long, device=device)
    q = torch.randn(batch, args.heads, args.head_dim, device=device, dtype=torch.bfloat16, generator=g)
    return layers, lens, q


def paths(layers, lens, q, scale: float, splits: int) -> dict:
    """The step of each attention path: one call per layer."""
    return {
        "one pass": lambda: [triton_decode(q, k, v, t, lens, scale, splits=1) for k, v, t in layers],
        f"split-KV ({splits} splits)": lambda: [triton_decode(q, k, v, t, lens, scale) for k, v, t in layers],
        "gather": lambda: [gather_decode(q, k, v, t, lens, scale) for k, v, t in layers],
    }


def bench_point(args, batch: int, context: int, device, gb_s: float) -> None:
    layers, lens, q = case(args, batch, context, device)
    floor = floor_ms(args, batch, context, gb_s)
    splits = decode_splits(batch, args.kv_heads, layers[0][2].shape[1] * args.block_size, sm_count(device))
    for name, call in paths(layers, lens, q, args.head_dim**-0.5, splits).items():
        ms = step_ms(call)
        print(
            f"batch {batch:>3} ctx {context:>6} {name:<22} {ms:8.3f} ms/step "
            f"(floor {floor:.3f} ms, {floor / ms:5.1%} of it)"
        )


def flash_attention_splits(programs: int, sms: int, key_blocks: int, max_splits: int = 64) -> int:
    """FlashAttention-2's ``num_splits_heuristic`` (``flash_api.cpp``), for comparison: no split once the programs
    nearly fill the SMs (80%); else the fewest splits whose wave efficiency is within 85% of the best."""
    if programs >= 0.8 * sms:
        return 1
    max_splits = min(max_splits, sms, key_blocks)
    ceil_div = lambda a, b: -(-a // b)  # noqa: E731

    def eligible(s: int) -> bool:  # a split count that leaves the blocks per split the same as one fewer is not
        return s == 1 or ceil_div(key_blocks, s) != ceil_div(key_blocks, s - 1)

    eff = {s: (programs * s / sms) / ceil_div(programs * s, sms) for s in range(1, max_splits + 1) if eligible(s)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= 0.85 * best)


def pick_losses(rows: pd.DataFrame, picks=("engine_full_width", "exact_width", "flash_attention_2")) -> pd.DataFrame:
    """Per (batch, context) of a sweep: the fastest forced split count and its ms, and each rule's pick with its time
    over the fastest (the sweep times every pick; a CSV from before it did, at 4c42555, lacks the engine's full-width
    picks at batches 1-32, and their loss reads NaN: the nearest timed count is not it)."""
    out = []
    for (batch, context), g in rows.groupby(["batch", "context"], sort=True):
        ms = g.set_index("splits")["ms"]
        row = {"batch": batch, "context": context, "fastest": int(ms.idxmin()), "fastest_ms": float(ms.min())}
        for pick in picks:
            s = int(g[pick].iloc[0])
            row[pick] = s
            row[f"{pick}_loss"] = float(ms[s] / ms.min()) if s in ms.index else float("nan")
        out.append(row)
    return pd.DataFrame(out)


# the split programs' launch before 5f422f8: a fixed 64-key tile at Triton's default warps and stages, timed beside
# the device's measured launch that they take since (split_launch), so one sweep shows what the change bought
FIXED_SPLIT_LAUNCH = {"KEYS": KEYS_PER_ITER}


def _step(layers, lens, q, scale: float, splits: int, launch: dict | None = None) -> list:
    return [triton_decode(q, k, v, t, lens, scale, splits=splits, split_launch_kw=launch) for k, v, t in layers]


def sweep_splits(args, device, gb_s: float) -> list[dict]:
    """Every (batch, context) of the grid at every forced split count: one row each, with the engine's picks."""
    rows = []
    sms = sm_count(device)
    for batch in SWEEP_BATCHES:
        for context in SWEEP_CONTEXTS:
            layers, lens, q = case(args, batch, context, device)
            floor = floor_ms(args, batch, context, gb_s)
            picks = {
                "engine_full_width": decode_splits(batch, args.kv_heads, args.engine_width, sms),
                "exact_width": decode_splits(batch, args.kv_heads, layers[0][2].shape[1] * args.block_size, sms),
                "flash_attention_2": flash_attention_splits(batch * args.kv_heads, sms, -(-context // 64)),
            }
            # each rule's pick is timed too: on an H100 (2026-12-07) the engine's picks at full width (16, 9, 5)
            # fell between the grid's counts, so their loss read NaN at batches 1-32
            for splits in sorted(set(SWEEP_SPLITS) | set(picks.values())):
                ms = step_ms(functools.partial(_step, layers, lens, q, args.head_dim**-0.5, splits))
                fixed = (
                    step_ms(functools.partial(_step, layers, lens, q, args.head_dim**-0.5, splits, FIXED_SPLIT_LAUNCH))
                    if splits > 1
                    else ms  # one pass never took the split launch
                )
                rows.append({"batch": batch, "context": context, "splits": splits, "ms": ms, "fixed_tile_ms": fixed,
                             "floor_ms": floor, "sms": sms, **picks})  # fmt: skip
                print(f"batch {batch:>3} ctx {context:>5} splits {splits}: {ms:.3f} ms, fixed tile {fixed:.3f} "
                      f"(floor {floor:.3f}; engine picks {picks['engine_full_width']} at full width)")  # fmt: skip
            layers = lens = q = None
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--sweep-splits", action="store_true", help="the forced-splits grid instead of the three points")
    p.add_argument("--engine-width", type=int, default=4096, help="keys of the widest decode graph (max_model_len)")
    p.add_argument("--out", default=None, help="CSV of the --sweep-splits rows")
    args = p.parse_args()
    device = torch.device("cuda")
    gb_s = copy_gb_s(device)
    tuning = tune_triton_decode(args.heads, args.kv_heads, args.head_dim, args.block_size, torch.bfloat16, device)
    print(f"{torch.cuda.get_device_name()}, {sm_count(device)} SMs, copy {gb_s:,.0f} GB/s; one pass: {tuning}")
    print(f"attention {args.heads}/{args.kv_heads} heads, head_dim {args.head_dim}, bf16, {args.layers} layers")
    if args.sweep_splits:
        rows = pd.DataFrame(sweep_splits(args, device, gb_s))
        if args.out:
            rows.assign(gpu=torch.cuda.get_device_name(), copy_gb_s=gb_s).to_csv(args.out, index=False)
        with pd.option_context("display.width", 200):
            print(pick_losses(rows).to_string(index=False, float_format="{:.3f}".format))
        return
    for batch, context in POINTS:
        bench_point(args, batch, context, device, gb_s)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
