"""A decode step's linear work on the GPU: the engine's chain (Inductor + cuBLAS) against ``kernels.small_linear``.

One "step" is ``--layers`` layers of a decoder's linear work without attention (its output is a fixed tensor):

    engine: h, qkv = attention_qkv(h, delta, ...); h, delta = attention_outputs(h, attn, ...)   (models.llama)
    fused:  h, qkv = norm_linear(h, delta, ...); o = linear(attn, o_w); h, gu = norm_linear(h, o, ...);
            delta = silu_mul_linear(gu, down_w)

each layer with weights of its own (so a step reads them from HBM, as a model's does), both captured in one CUDA
graph and timed with CUDA events over replays (``measure.timing.time_fn``); "engine" is run eager and compiled
as the engine compiles its blocks (``models.layers.compiled``). The floor is the step's weight bytes over the
device-to-device copy bandwidth measured in the same run (``measure.ceilings``). Rows of one launch each
(``--ops``) time every matrix alone, ``F.linear`` against ``small_linear.linear``.

    python scripts/bench_small_linear.py --out small_linear.csv              # Qwen2-0.5B and Llama-3-8B shapes
    python scripts/bench_small_linear.py --out sweep.csv --sweep --rows 1   # + every launch of SWEEP
    python scripts/bench_small_linear.py --out pdl.csv --pdl --rows 1       # + the default launch with PDL
    TRITON_INTERPRET=1 python scripts/bench_small_linear.py --smoke --out x.csv   # on a CPU: does it run? (a test)

Writes one CSV row per (shape, rows, path) and the device record beside it (``<out>.device.json``); a
development measurement for issue 29, not a book figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from servelab.kernels.small_linear import linear, norm_linear, silu_mul_linear
from servelab.measure.ceilings import measure_ceilings
from servelab.measure.device import device_record
from servelab.measure.timing import time_fn
from servelab.models.layers.compiled import compiled
from servelab.models.llama import attention_outputs, attention_qkv

# (hidden, intermediate, q_dim, kv_dim, qkv bias, layers timed); "tiny" is the CPU smoke test's (``--smoke``)
SHAPES = {"qwen2-0.5b": (896, 4864, 896, 128, True, 24), "llama-3-8b": (4096, 14336, 4096, 1024, False, 4)}
TINY = {"tiny": (48, 80, 32, 8, True, 2)}
EPS = 1e-6


def layer_weights(hidden, inter, q_dim, kv_dim, bias, layers, device, dtype):
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype) * scale

    return [
        dict(
            nw1=1 + rnd(hidden, scale=0.1),
            qkv_w=rnd(q_dim + 2 * kv_dim, hidden, scale=hidden**-0.5),
            qkv_b=rnd(q_dim + 2 * kv_dim, scale=0.1) if bias else None,
            o_w=rnd(hidden, q_dim, scale=q_dim**-0.5),
            nw2=1 + rnd(hidden, scale=0.1),
            gu_w=rnd(2 * inter, hidden, scale=hidden**-0.5),
            down_w=rnd(hidden, inter, scale=inter**-0.5),
        )
        for _ in range(layers)
    ]


def engine_step(layers, h, delta, attn, pre=attention_qkv, post=attention_outputs):
    for w in layers:
        h, qkv = pre(h, delta, w["nw1"], EPS, w["qkv_w"], w["qkv_b"])
        h, delta = post(h, attn, w["o_w"], w["nw2"], EPS, w["gu_w"], w["down_w"])
    return h, delta, qkv


def fused_step(layers, h, delta, attn, **kw):
    for w in layers:
        h, qkv = norm_linear(h, delta, w["nw1"], EPS, w["qkv_w"], w["qkv_b"], **kw)
        h, gate_up = norm_linear(h, linear(attn, w["o_w"], **kw), w["nw2"], EPS, w["gu_w"], **kw)
        delta = silu_mul_linear(gate_up, w["down_w"], **kw)
    return h, delta, qkv


def graph_ms(call) -> tuple[float, float, float]:
    """Median ms (and quartiles) of one replay of ``call`` captured in a CUDA graph (on a CPU, ``--smoke``: of one
    call, a check that the script runs and no measurement)."""
    call()
    if not torch.cuda.is_available():
        t = time_fn(call, warmup=0, repeats=2, device="cpu")
        return t.median_ms, t.p25_ms, t.p75_ms
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    t = time_fn(graph.replay, warmup=10, repeats=50)
    return t.median_ms, t.p25_ms, t.p75_ms


def timed_row(call, floor_ms: float, **labels) -> dict:
    """``labels`` and the timing of ``call`` in a CUDA graph, against its memory floor."""
    med, p25, p75 = graph_ms(call)
    return labels | dict(ms=med, p25_ms=p25, p75_ms=p75, floor_ms=floor_ms, of_floor=floor_ms / med)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


SWEEP = [dict(block_n=bn, num_warps=nw, split_k=1) for bn in (1, 2, 4, 8, 16) for nw in (2, 4, 8)]
# split over the reduction too: more programs for a matrix with few outputs and many inputs (down), and smaller
# reduction steps (64 outputs a program take 64 inputs a step)
SPLIT_SWEEP = [dict(block_n=bn, num_warps=4, split_k=sk) for bn in (4, 16, 64) for sk in (2, 4, 8)]
SWEEPS = {None: [], "launches": SWEEP, "split": SPLIT_SWEEP, "all": SWEEP + SPLIT_SWEEP}


def label(kw: dict) -> str:
    if kw == {"pdl": True}:
        return " (pdl)"
    if not kw:
        return ""
    split = f", split_k {kw['split_k']}" if kw.get("split_k", 1) > 1 else ""
    return f" (block_n {kw['block_n']}, {kw['num_warps']} warps{split})"


def bench_shape(name, rows, device, dtype, copy_gb_s, ops, sweep, pdl=False):
    hidden, inter, q_dim, kv_dim, bias, n_layers = (SHAPES | TINY)[name]
    layers = layer_weights(hidden, inter, q_dim, kv_dim, bias, n_layers, device, dtype)
    weight_bytes = sum(t.numel() * t.element_size() for w in layers for t in w.values() if t is not None)
    floor_ms = weight_bytes / (copy_gb_s * 1e9) * 1e3
    g = torch.Generator(device=device).manual_seed(1)
    h, delta = (torch.randn(rows, hidden, generator=g, device=device, dtype=dtype) for _ in range(2))
    attn = torch.randn(rows, q_dim, generator=g, device=device, dtype=dtype)
    pre, post = compiled(attention_qkv), compiled(attention_outputs)
    paths = {"engine eager": lambda: engine_step(layers, h, delta, attn)}
    if device.type == "cuda":  # Inductor on a CPU would build C++ for minutes: the smoke test leaves it out
        paths["engine compiled"] = lambda: engine_step(layers, h, delta, attn, pre, post)
    launches = [{}] + ([{"pdl": True}] if pdl else []) + SWEEPS[sweep]
    for kw in launches:
        paths["fused" + label(kw)] = lambda kw=kw: fused_step(layers, h, delta, attn, **kw)
    want = paths["engine eager"]()
    where = dict(shape=name, rows=rows, layers=n_layers)
    out = [
        timed_row(call, floor_ms, **where, what="layers", path=path)
        | {"max_rel_err": max(rel_err(a, b) for a, b in zip(call(), want, strict=True))}
        for path, call in paths.items()
    ]
    if ops:
        x = {"qkv_w": h, "o_w": attn, "gu_w": h, "down_w": torch.randn(rows, inter, device=device, dtype=dtype)}
        for key, xin in x.items():
            wts = [w[key] for w in layers]
            key_floor_ms = sum(t.numel() * t.element_size() for t in wts) / (copy_gb_s * 1e9) * 1e3
            calls = {"F.linear": F.linear} | {
                "small_linear" + label(kw): lambda x, w, kw=kw: linear(x, w, **kw) for kw in launches
            }
            out += [
                timed_row(
                    lambda fn=fn, xin=xin, wts=wts: [fn(xin, w) for w in wts],
                    key_floor_ms,
                    **where,
                    what=key,
                    path=path,
                )
                for path, fn in calls.items()
            ]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--no-ops", action="store_true", help="only the layer chains")
    p.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        choices=["all", "launches", "split"],
        help="also every launch of SWEEP (block_n, num_warps: 'launches'), of SPLIT_SWEEP (split over the reduction "
        "too: 'split'), or both (the flag alone)",
    )
    p.add_argument(
        "--pdl",
        action="store_true",
        help="also the default launch with programmatic dependent launch (Hopper or later): each launch reads its "
        "first weight tile while the one before it drains",
    )
    p.add_argument(
        "--smoke", action="store_true", help="on a CPU under TRITON_INTERPRET=1: the tiny shape, float32, no timing"
    )
    args = p.parse_args(argv)
    if args.smoke:
        device, dtype, args.shapes = torch.device("cpu"), torch.float32, list(TINY)
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
    record = device_record(device)
    ceilings = measure_ceilings(device, copy_mib=8 if args.smoke else None, matmul_n=64 if args.smoke else None)
    rows = []
    for name in args.shapes:
        for r in args.rows:
            rows += bench_shape(name, r, device, dtype, ceilings.copy_gb_s, not args.no_ops, args.sweep, args.pdl)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    table = pd.DataFrame(rows)
    out = Path(args.out)
    table.to_csv(out, index=False)
    meta = {"device": record.close().as_dict(), "ceilings": ceilings.as_dict()}
    out.with_suffix(".device.json").write_text(json.dumps(meta, indent=1, default=str))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(record.summary())
        print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
