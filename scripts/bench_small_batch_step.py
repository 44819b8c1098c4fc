"""A decode step of the engine with its blocks through small_linear (``models.small_batch``, issue 29) against the
unfused engine (the default until issue 29) and the ``fused_rope_kv_write`` switch alone, on a GPU: the step's time
at a small batch, its kernels per step, and how far its logits are from the unfused one's.

    python scripts/bench_small_batch_step.py --out small_batch_step.csv   # Qwen2-0.5B and its 128k-vocab draft shape
    TRITON_INTERPRET=1 python scripts/bench_small_batch_step.py --smoke --out x.csv   # a CPU: does it run? (a test)

Each path is one engine step as the engine bench times it (``bench.step.engine_step``: a decode graph of exactly the
batch, the blocks compiled under the engine's check), timed with CUDA events over replays (``measure.time_fn``), with
its kernels counted by the profiler (``bench.decode_rows.profile_step``). The floor is the step's bytes (weights and
KV, ``ModelShape.decode_bytes``) over the copy bandwidth measured in the same run. The small path's logits are set
beside the unfused one's (bf16: the sums run in another order, so they differ by rounding; the argmax column counts the
rows whose greedy token agrees). Writes one row per (shape, batch, path) and the device record beside the CSV
(``<out>.device.json``). Development data, not a book figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servelab.bench.decode_rows import profile_step  # noqa: E402
from servelab.bench.step import engine_step  # noqa: E402
from servelab.kernels.small_linear import MAX_ROWS  # noqa: E402
from servelab.measure import time_fn  # noqa: E402
from servelab.measure.bench_rows import error_fields, show  # noqa: E402
from servelab.measure.ceilings import measure_ceilings  # noqa: E402
from servelab.measure.device import device_record  # noqa: E402
from servelab.models import ModelShape, load_model  # noqa: E402
from servelab.models.small_batch import use_small_linear, uses_small_linear  # noqa: E402

SHAPES = ["qwen2-0.5b", "qwen2-0.5b-vocab128k"]
PATHS = {  # name: (fused_rope_kv_write, small_linear blocks: None, "blocks", or "rope_in_qkv" too; EngineConfig.pdl)
    "unfused": (False, None, False),  # the engine's default until issue 29
    "fused_rope_kv_write": (True, None, False),
    "small_linear": (True, "blocks", False),
    # RoPE and the pool write in the qkv launch (small_linear.norm_linear_rope_kv): five launches a layer, not six
    "small_linear_rope_in_qkv": (True, "rope_in_qkv", False),
    # the same with programmatic dependent launch: each small_linear launch reads its first weight tile while the
    # launch before it drains, and decode attention starts while the qkv launch drains (Hopper or later; a CPU has
    # none, so the smoke run leaves it out)
    "small_linear_rope_in_qkv_pdl": (True, "rope_in_qkv", True),
}


@contextmanager
def small_blocks(on: str | None):
    """While on ("blocks", or "rope_in_qkv" with RoPE and the pool write in the qkv launch), every engine built from an
    HF model runs ``use_small_linear`` blocks (``Engine.from_hf`` imports ``native_from_hf`` when it is called, so
    the module's attribute is what it gets)."""
    import servelab.models.native as native

    real = native.native_from_hf

    def switched(*a, **kw):
        model = real(*a, **kw)
        # the kernel at every width it takes, not just the default's
        use_small_linear(model, max_rows=MAX_ROWS, rope_in_qkv=on == "rope_in_qkv")
        return model

    native.native_from_hf = switched if on else real
    try:
        yield
    finally:
        native.native_from_hf = real


def bench_shape(name: str, batches, context: int, device, dtype, copy_gb_s: float, repeats: int) -> list[dict]:
    hf = load_model(f"config:{name}", dtype=dtype, device=device, load_tokenizer=False).model
    shape = ModelShape.from_config(hf.config)
    cuda = device.type == "cuda"
    rows = []
    for batch in batches:
        floor_ms = shape.decode_bytes(batch, context) / (copy_gb_s * 1e9) * 1e3
        reference = None
        for path, (fused, small, pdl) in PATHS.items():
            if pdl and not cuda:
                continue
            row = dict(shape=name, batch=batch, context=context, path=path, floor_ms=floor_ms, status="ok")
            try:
                with small_blocks(small):
                    # small_batch off where the path has none: the engine's own switch would add it to the fused path
                    fn, before = engine_step(
                        hf, batch, 1, context, compile=cuda, fused_rope_kv_write=fused, small_batch=small is not None,
                        pdl=pdl,
                    )  # fmt: skip
                engine = fn.engine
                t = time_fn(fn, warmup=3, repeats=repeats, device=device, before_each=before)
                row |= dict(ms=t.median_ms, p25_ms=t.p25_ms, p75_ms=t.p75_ms, of_floor=floor_ms / t.median_ms)
                row |= dict(ran=fn.path(), compile=engine.compile_status, small_blocks=uses_small_linear(engine.model))
                logits = fn().float()
                if reference is None:
                    reference = logits.clone()
                scale = reference.abs().max().clamp_min(1e-30)
                row["max_rel_diff"] = float((logits - reference).abs().max() / scale)
                row["argmax_agrees"] = f"{int((logits.argmax(-1) == reference.argmax(-1)).sum())}/{batch}"
                if cuda:
                    row |= profile_step(fn, before)
            except Exception as e:  # noqa: BLE001 - a path that fails is a row, and the others still run
                row |= error_fields(e)
            finally:
                fn = engine = None
                if cuda:
                    torch.cuda.empty_cache()
            rows.append(row)
            show(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--batch", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--smoke", action="store_true", help="on a CPU under TRITON_INTERPRET=1: tiny-qwen2, float32")
    args = p.parse_args(argv)
    if args.smoke:
        device, dtype = torch.device("cpu"), "float32"
        args.shapes, args.batch, args.context, args.repeats = ["tiny-qwen2"], [2], 16, 2
    else:
        device, dtype = torch.device("cuda"), "bfloat16"
    record = device_record(device)
    ceilings = measure_ceilings(device, copy_mib=8 if args.smoke else None, matmul_n=64 if args.smoke else None)
    rows = []
    for name in args.shapes:
        rows += bench_shape(name, args.batch, args.context, device, dtype, ceilings.copy_gb_s, args.repeats)
    table = pd.DataFrame(rows)
    out = Path(args.out)
    table.to_csv(out, index=False)
    meta = {"device": record.close().as_dict(), "ceilings": ceilings.as_dict()}
    out.with_suffix(".device.json").write_text(json.dumps(meta, indent=1, default=str))
    cols = ["shape", "batch", "path", "ms", "floor_ms", "kernels", "max_rel_diff", "argmax_agrees", "status"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(record.summary())
        print(table[[c for c in cols if c in table]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
