"""Decode attention's one-pass launch, every candidate the engine's tuner chooses from, timed where the engine runs.

``kernels.triton_decode.tune_triton_decode`` picks the kernel's tile, warps and stages once per process by timing
each candidate for ~30 ms at one shape (batch 128 x 1,024 keys). On the H200 that choice varied between Study 1's
server processes (Llama-3-8B: three configurations over 22 launches), and the spec bench's c moved with it on the
H100. This bench times every candidate, longer and in CUDA graphs, at the decode points the engine serves, and
records what the tuner picks in the same process, so that a table of one configuration per device can be chosen
from measurements and the tuner's spread seen beside it. Run it in several fresh processes (``--process``).

Each step is ``--layers`` one-pass calls over pools of their own (as ``bench_decode_kernel.py``); its memory floor
is the step's K/V bytes over the copy bandwidth measured first.

    python scripts/bench_decode_tuning.py --process 0 --out decode_tuning.csv   (appends)

Its rows for a device, committed as ``data/tuning/decode_launch/<device slug>.csv``, are what
``kernels.decode_launch`` chooses the device's launch from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode_kernel import copy_gb_s, step_ms  # noqa: E402

from servelab.kernels.triton_decode import (  # noqa: E402
    _TUNE_CONFIGS,
    _TUNED,
    _launch,
    _paged_decode_kernel,
    tune_triton_decode,
)
from servelab.measure.device import device_record  # noqa: E402

# (name, heads, kv heads, head_dim): the book's two model shapes
SHAPES = (("qwen2-0.5b", 14, 2, 64), ("llama-3-8b", 32, 8, 128))
# (batch, context): batch-1 decode, a small batch, Study 1's loaded server, and the tuner's own point
POINTS = ((1, 128), (8, 1024), (64, 512), (128, 1024))
BLOCK = 16


def pools(batch: int, context: int, kv_heads: int, head_dim: int, layers: int, device):
    g = torch.Generator(device=device).manual_seed(0)
    per_seq = -(-context // BLOCK)
    out = []
    for _ in range(layers):
        k = torch.randn(batch * per_seq, BLOCK, kv_heads, head_dim, device=device, dtype=torch.bfloat16, generator=g)
        tables = torch.randperm(batch * per_seq, device=device, generator=g).view(batch, per_seq)
        out.append((k, torch.randn_like(k), tables))
    return out


def one_pass(layers, q, lens, out, keys: int, warps: int, stages: int):
    """A step: the one-pass kernel over each layer's pool, at one launch configuration."""
    scale = q.shape[-1] ** -0.5

    def step():
        for k, v, t in layers:
            _launch(
                _paged_decode_kernel, q, k, v, t, lens, out, out, scale, 1,
                KEYS=keys, MIN_KEYS=1, num_warps=warps, num_stages=stages,
            )  # fmt: skip

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--process", type=int, default=0, help="which fresh process this is (a column of the CSV)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = torch.device("cuda")
    gb_s = copy_gb_s(device)
    rows = []
    for name, heads, kv_heads, d in SHAPES:
        _TUNED.clear()
        tuned = tune_triton_decode(heads, kv_heads, d, BLOCK, torch.bfloat16, device)
        print(f"{name}: the tuner picks {tuned}")
        for batch, context in POINTS:
            layers = pools(batch, context, kv_heads, d, args.layers, device)
            lens = torch.full((batch,), context, dtype=torch.long, device=device)
            q = torch.randn(batch, heads, d, device=device, dtype=torch.bfloat16)
            out = torch.empty_like(q)
            floor_ms = args.layers * 2 * batch * context * kv_heads * d * 2 / (gb_s * 1e9) * 1e3
            for cfg in _TUNE_CONFIGS:
                keys, warps, stages = cfg.kwargs["KEYS"], cfg.num_warps, cfg.num_stages

                try:
                    ms, status = step_ms(one_pass(layers, q, lens, out, keys, warps, stages)), "ok"
                except Exception as e:  # noqa: BLE001 - a launch the GPU refuses (shared memory) is a row, not a stop
                    ms, status = float("nan"), f"{type(e).__name__}: {e}"[:200]
                rows.append(
                    dict(
                        process=args.process, shape=name, heads=heads, kv_heads=kv_heads, head_dim=d,
                        block_size=BLOCK, device=torch.cuda.get_device_name(), batch=batch, context=context,
                        keys=keys, warps=warps, stages=stages, status=status, ms=ms, floor_ms=floor_ms,
                        layers=args.layers, tuner=tuned,
                    )
                )  # fmt: skip
                print(f"{name} b{batch:>3} ctx {context:>5} KEYS={keys:>3} w{warps} s{stages}: {ms:.4f} ms")
            del layers
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df.to_csv(args.out, mode="a", header=not args.out.exists(), index=False)
    meta = {"device": device_record(device).close().as_dict(), "copy_gb_s": gb_s}
    args.out.with_suffix(f".device{args.process}.json").write_text(json.dumps(meta, indent=1, default=str))


if __name__ == "__main__":
    main()
