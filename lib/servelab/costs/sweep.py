"""Sweeps of timed forward steps (prefill and decode) in each execution mode, as tidy rows.

Every row carries the measured time with its spread, the step's FLOPs and bytes (``ModelShape``),
the roofline floor from the ceilings measured in the same run, and % of that floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from servelab.hf_modes import MODES
from servelab.measure.roofline import Roofline
from servelab.measure.timing import time_fn
from servelab.models.shape import ModelShape


@dataclass(frozen=True)
class StepPoint:
    phase: str        # "prefill" or "decode"
    batch: int        # sequences in the step
    new_tokens: int   # new tokens per sequence (1 for decode)
    context: int      # cached tokens per sequence before the step


def prefill_points(lengths, batches, max_batch_tokens: int) -> list[StepPoint]:
    """Prefill of ``length`` tokens for ``batch`` sequences, skipping steps over ``max_batch_tokens``."""
    return [StepPoint("prefill", b, n, 0) for b in batches for n in lengths if b * n <= max_batch_tokens]


def decode_points(batches, contexts, max_kv_tokens: int) -> list[StepPoint]:
    """One decode step for ``batch`` sequences of ``context`` cached tokens, up to ``max_kv_tokens`` cached."""
    return [StepPoint("decode", b, 1, c) for b in batches for c in contexts if b * c <= max_kv_tokens]


def _dtype_bytes(model) -> int:
    return model.dtype.itemsize


def step_sweep(model, model_name: str, points: list[StepPoint], modes: list[str], roofline: Roofline,
               *, warmup: int = 2, repeats: int = 7, desc: str | None = None) -> pd.DataFrame:
    """Time every point in every mode. A point that fails (e.g. out of memory) is recorded, not fatal."""
    import torch

    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose from {sorted(MODES)}")
    shape = ModelShape.from_config(model.config)
    nbytes = _dtype_bytes(model)
    rows = []
    todo = [(m, p) for m in modes for p in points]
    for mode, p in tqdm(todo, desc=desc or f"{model_name} steps", leave=False):
        if p.phase == "decode":
            flops, bts = shape.decode_flops(p.batch, p.context), shape.decode_bytes(p.batch, p.context, nbytes)
        else:
            flops = shape.prefill_flops(p.new_tokens, p.context, p.batch)
            bts = shape.prefill_bytes(p.new_tokens, p.context, p.batch, nbytes)
        row = dict(model=model_name, mode=mode, phase=p.phase, batch=p.batch, new_tokens=p.new_tokens,
                   context=p.context, flops=flops, bytes=bts)
        try:
            fn, before = MODES[mode](model, p.batch, p.new_tokens, p.context)
            t = time_fn(fn, warmup=warmup, repeats=repeats, device=model.device, before_each=before)
            row.update(status="ok", **t.as_row())
            del fn, before
        except torch.OutOfMemoryError:
            row.update(status="oom")
        except getattr(torch, "AcceleratorError", ()):
            raise  # a device-side fault poisons the CUDA context: stop rather than record every later point as failed
        except RuntimeError as e:  # a mode that cannot run this point is reported as such
            row.update(status=f"error: {str(e).splitlines()[0][:120]}")
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
    df = pd.DataFrame(rows)
    ok = df["status"] == "ok"
    if ok.any():
        tokens = df["batch"] * df["new_tokens"]
        df.loc[ok, "us_per_token"] = df.loc[ok, "median_ms"] * 1e3 / tokens[ok]
        df.loc[ok, "floor_ms"] = roofline.floor_ms(df.loc[ok, "flops"], df.loc[ok, "bytes"])
        df.loc[ok, "bound"] = roofline.bound(df.loc[ok, "flops"], df.loc[ok, "bytes"])
        df.loc[ok, "pct_of_floor"] = roofline.pct_of_floor(df.loc[ok, "median_ms"], df.loc[ok, "flops"], df.loc[ok, "bytes"])
        df.loc[ok, "achieved_tflop_s"] = roofline.achieved_tflop_s(df.loc[ok, "median_ms"], df.loc[ok, "flops"])
        df.loc[ok, "achieved_gb_s"] = roofline.achieved_gb_s(df.loc[ok, "median_ms"], df.loc[ok, "bytes"])
    return df
