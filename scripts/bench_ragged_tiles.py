"""How many tokens a packed tile of the ragged kernel should hold, on the GPU: mixed steps' attention at several
``tile_tokens``, and with the short runs (decodes) in packed tiles of their own.

Why: the H100 step budget (``data/dev/nvidia-h100/2026-12-07/smoke_5eff602/engine_step_budget.csv``) has a mixed
step of 63 decodes at 512 keys plus a 512-token chunk spend 1.21 ms of its 3.01 ms in attention, about 50 µs a
layer, while the decode graph's kernel takes the same 64 decodes in about 14 µs a layer. A packed tile of
Qwen2-0.5B holds 16 tokens × 8 padded query heads = 128 rows (``ragged.ragged_tile_tokens``), and a decode fills 7
of them: every key tile it reads costs a 128-row product for 7 rows' worth of work.

Qwen2-0.5B's attention (14 heads, 2 KV heads, head_dim 64) and Llama-3-8B's (32, 8, 128; a packed tile of 16 tokens
× 4 query heads, 64 rows), bf16, block size 16. Each case is one step's tiles
(``ragged.plan_tiles``, no split columns, as the engine's default plans them). Paths:

- ``packed@N``: every run shorter than a long tile in packed tiles of N tokens (at least 16 rows), one
  ``triton_ragged`` call (N = 16 was the engine's until 2026-12-07; since, ``ragged_tile_tokens`` gives 16 rows:
  N = 2 at Qwen2-0.5B's shape, 4 at Llama-3-8B's);
- ``apart@N``: runs of at most ``--short`` tokens in packed tiles of N tokens, in a call of their own, and the rest
  (packed tiles of 16 and the long tiles) in a second call;
- ``decode``: in steps of decodes alone, the decode graph's kernel (``triton_decode``, split as it chooses, at
  the launch the engine takes: ``tune_triton_decode``, the device's measured one where there is one), so a pure
  decode step's two kernels are timed on the same inputs;
- a suffix ``/kK`` walks K keys an iteration (64 by default), ``/wW`` launches W warps a program (by default 4, or 8
  for the largest tiles).

Ten calls are captured in one CUDA graph so Python's launch cost is out of the timing, its replays timed with CUDA
events (``measure.time_fn``): the median of 30 replays after warm-up, in µs per call, with the quartiles.
``max_abs_diff`` is each output's largest difference from ``packed@16``'s (the same sums per row, so 0 or
rounding).

    python scripts/bench_ragged_tiles.py --out ragged_tiles.csv
    TRITON_INTERPRET=1 python scripts/bench_ragged_tiles.py --smoke --out x.csv   # a CPU: does it run?
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servelab.kernels.ragged import (  # noqa: E402
    RaggedTiles,
    max_long_tiles,
    max_tiles,
    plan_tiles,
    ragged_long_tile_tokens,
    ragged_tile_tokens,
)
from servelab.kernels.triton_decode import triton_decode, tune_triton_decode  # noqa: E402
from servelab.kernels.triton_ragged import triton_ragged  # noqa: E402
from servelab.measure import time_fn  # noqa: E402

SHAPES = {"qwen2-0.5b": (14, 2, 64), "llama-3-8b": (32, 8, 128)}  # query heads, KV heads, head_dim
BLOCK = 16
CASES = {  # (tokens, first position) per sequence
    "63 decodes at 512 + a 512 chunk": [(1, 511)] * 63 + [(512, 0)],
    "3 decodes at 2432 + a 512 chunk": [(1, 2431)] * 3 + [(512, 0)],
    "24 decodes at 2304 + a 512 chunk": [(1, 2303)] * 24 + [(512, 0)],
    "63 decodes at 128 + a 512 chunk": [(1, 127)] * 63 + [(512, 0)],
    "255 decodes at 600 + a 256 chunk": [(1, 599)] * 255 + [(256, 0)],
    "64 decodes at 512 alone": [(1, 511)] * 64,
    "8 runs of 5 at 512 (verification)": [(5, 511)] * 8,
    "a 100-token chunk after 2048 + 31 decodes": [(100, 2048)] + [(1, 511)] * 31,
    "256 decodes at 600 alone": [(1, 599)] * 256,
    "a decode at 16K alone": [(1, 16383)],
}
TILE_TOKENS = (16, 8, 4, 2)
OLD_TILE_TOKENS = 16  # the engine's packed tiles before 2026-12-07 at both shapes: ``apart@N``'s other call


def table(cols: list, width: int, device) -> torch.Tensor:
    t = torch.zeros(4, max(width, 1), dtype=torch.long)
    if cols:
        t[:, : len(cols)] = torch.tensor(cols).t()
    return t.to(device)


def step(runs, shape, device, dtype):
    heads, kv_heads, head_dim = shape
    width = -(-max(n + p for n, p in runs) // BLOCK)
    blocks = width * len(runs)
    kp = torch.randn(blocks, BLOCK, kv_heads, head_dim, device=device, dtype=dtype)
    vp = torch.randn_like(kp)
    tables = torch.randperm(blocks, device=device).view(len(runs), width)
    spans, start = [], 0
    for row, (n, pos) in enumerate(runs):
        spans.append((row, start, n, pos))
        start += n
    q = torch.randn(start, heads, head_dim, device=device, dtype=dtype)
    return q, kp, vp, tables, spans


def tiles_for(spans, tables, tt: int, lt: int, device, total: int) -> RaggedTiles:
    packed, long = plan_tiles(spans, tt, lt)
    return RaggedTiles(
        table(packed, max_tiles(total, len(spans), tt), device), tables, tt,
        table(long, max_long_tiles(total, lt), device) if lt else None, lt,
    )  # fmt: skip


def launch(path: str) -> dict:
    """``triton_ragged``'s keyword arguments of ``path``'s suffixes."""
    opts = {}
    for part in path.split("/")[1:]:
        opts["keys" if part[0] == "k" else "num_warps"] = int(part[1:])
    return opts


@dataclass
class DecodeCall:
    """A step of decodes alone through the decode graph's kernel: each row's block table and context length."""

    block_tables: torch.Tensor
    context_lens: torch.Tensor


def calls(path: str, shape, spans, tables, total: int, short: int, device):
    """The kernel calls one step of ``path`` makes (``triton_ragged`` tile sets, or a ``DecodeCall``); None where
    the path does not apply (``decode`` on a step with more than decodes)."""
    if path == "decode":
        if any(n != 1 for _, _, n, _ in spans):
            return None
        lens = torch.tensor([pos + 1 for _, _, _, pos in spans], dtype=torch.long, device=device)
        return [DecodeCall(tables[[row for row, _, _, _ in spans]], lens)]
    lt = ragged_long_tile_tokens(shape[2])
    kind, n = path.split("/")[0].split("@")
    n = max(int(n), ragged_tile_tokens(*shape[:2]))  # a tile has at least 16 query rows (tl.dot's smallest)
    if kind == "packed":
        return [tiles_for(spans, tables, n, lt, device, total)]
    small = [s for s in spans if s[2] <= short]
    rest = [s for s in spans if s[2] > short]
    sets = []
    if small:
        sets.append(tiles_for(small, tables, n, 0, device, sum(s[2] for s in small)))
    if rest:
        sets.append(tiles_for(rest, tables, OLD_TILE_TOKENS, lt, device, total))
    return sets


def run_all(q, kp, vp, sets, scale, opts=None):
    out = None
    for rt in sets:
        if isinstance(rt, DecodeCall):
            o = triton_decode(q, kp, vp, rt.block_tables, rt.context_lens, scale)
        else:
            o = triton_ragged(q, kp, vp, rt, scale, **(opts or {}))
        out = o if out is None else out + o  # each call writes its own rows and zeros elsewhere
    return out


def time_us(q, kp, vp, sets, scale, opts, repeats: int, graph: bool) -> tuple[float, float, float]:
    """(median, p25, p75) µs of one call: ten calls captured in a CUDA graph, its replays timed by
    ``measure.time_fn`` (CUDA events, after warm-up); on the interpreter (no graph) nothing is timed."""
    for _ in range(3):
        run_all(q, kp, vp, sets, scale, opts)
    if not graph:
        return 0.0, 0.0, 0.0
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            run_all(q, kp, vp, sets, scale, opts)
    t = time_fn(g.replay, warmup=3, repeats=repeats, device=q.device)
    return t.median_ms * 100, t.p25_ms * 100, t.p75_ms * 100  # ms per 10 calls -> µs per call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--short", type=int, default=8, help="apart@N: runs of at most this many tokens go apart")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="one small case on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    smoke_cases = {"2 decodes at 40 + a 20 chunk": [(1, 39), (1, 39), (20, 0)], "3 decodes alone": [(1, 39)] * 3}
    cases = smoke_cases if args.smoke else CASES
    shapes = {"tiny": (4, 2, 16)} if args.smoke else SHAPES
    # ``scripts/kernel_registers.py``: the engine's launch (16 tokens, 4 warps, 64 keys) spills at both shapes on
    # sm90, and 8 warps does not at Qwen2-0.5B's; so each size runs at its default warps and at 8
    paths = [f"{kind}@{n}{w}" for kind in ("packed", "apart") for n in TILE_TOKENS for w in ("", "/w8")]
    paths = [p for p in paths if not p.startswith("apart@16")] + ["packed@2/w2", "packed@16/k32/w8", "packed@2/k32"]
    paths.append("decode")
    if args.smoke:
        paths = ["packed@16", "packed@2", "apart@2", "packed@2/k32/w2", "decode"]
    rows = []
    name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    print(f"{name}: one layer's attention, bf16; µs per call, median of {args.repeats} (quartiles)")
    for (model, shape), (case, runs) in itertools.product(shapes.items(), cases.items()):
        torch.manual_seed(0)
        scale = shape[2] ** -0.5
        q, kp, vp, tables, spans = step(runs, shape, device, dtype)
        tune_triton_decode(*shape, BLOCK, dtype, device)  # the engine's launch, before any graph is captured
        total = q.shape[0]
        ref = None
        for path in paths:
            sets, opts = calls(path, shape, spans, tables, total, args.short, device), launch(path)
            if sets is None:
                continue
            if args.smoke:
                opts.pop("keys", None)  # the interpreter's 16-token smoke blocks
            out = run_all(q, kp, vp, sets, scale, opts)
            ref = out if ref is None else ref
            med, q1, q3 = time_us(q, kp, vp, sets, scale, opts, args.repeats, not args.smoke)
            diff = (out.float() - ref.float()).abs().max().item()
            rows.append(dict(device=name, model=model, case=case, path=path, launches=len(sets), us=med,
                             us_p25=q1, us_p75=q3, max_abs_diff=diff))  # fmt: skip
            print(f"{model:10s} {case:45s} {path:14s} {med:8.1f} ({q1:.1f}-{q3:.1f})  diff {diff:.3g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
