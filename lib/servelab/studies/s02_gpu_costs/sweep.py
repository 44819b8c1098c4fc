"""Sweeps of timed forward steps (``StepPoint``: prefill, decode, mixed) in each execution mode, as tidy rows.

Every row carries the measured time with its spread, the step's FLOPs and bytes (``ModelShape``),
the roofline floor from the ceilings measured in the same run, and % of that floor.
"""

from __future__ import annotations

import pandas as pd
from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets it warns

from servelab.bench.hf_modes import MIXED_MODES, MODES
from servelab.errors import ParameterError
from servelab.measure.roofline import Roofline
from servelab.measure.timing import time_fn
from servelab.models.shape import ModelShape
from servelab.studies.s02_gpu_costs.points import (
    StepPoint,
    context_prefill_points,
    decode_points,
    mixed_points,
    prefill_points,
)

__all__ = [
    "StepPoint",
    "step_sweep",
    "prefill_points",
    "decode_points",
    "context_prefill_points",
    "mixed_points",
    "time_steps",
]
NO_MIXED_STEP = "unsupported: HF's forward has no mixed step (engine modes only)"


def _check_modes(modes) -> None:
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose from {sorted(MODES)}")


def _dtype_bytes(model) -> int:
    return model.dtype.itemsize


def step_sweep(
    model, model_name: str, points: list[StepPoint], modes: list[str], roofline: Roofline, **kw
) -> pd.DataFrame:
    """Time every point in every mode (keywords as ``time_steps``)."""
    _check_modes(modes)
    return time_steps(model, model_name, [(m, p) for m in modes for p in points], roofline, **kw)


def time_steps(
    model,
    model_name: str,
    todo: list[tuple[str, StepPoint]],
    roofline: Roofline,
    *,
    warmup: int = 2,
    repeats: int = 7,
    desc: str | None = None,
    max_tokens: dict[str, int] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Time each ``(mode, point)`` of ``todo``, one row each. A point that fails (e.g. out of memory) is
    recorded, not fatal. ``progress``: a tqdm bar (off by default: a notebook page shows no bar).

    A mixed point in a mode that has no mixed step (the HF modes) gets a row with status ``NO_MIXED_STEP``;
    ``max_tokens`` maps a mode to the largest step (tokens) it runs, larger points get a "skipped" row.
    """
    import torch

    _check_modes({m for m, _ in todo})
    max_tokens = max_tokens or {}
    shape = ModelShape.from_config(model.config)
    nbytes = _dtype_bytes(model)
    rows = []
    for mode, p in tqdm(todo, desc=desc or f"{model_name} steps", leave=False, disable=not progress):
        flops, bts = p.work(shape, nbytes)
        row = dict(
            model=model_name,
            mode=mode,
            phase=p.phase,
            batch=p.batch,
            new_tokens=p.new_tokens,
            context=p.context,
            decodes=p.decodes,
            decode_context=p.decode_context,
            flops=flops,
            bytes=bts,
        )
        if p.phase == "mixed" and mode not in MIXED_MODES:
            rows.append(dict(row, status=NO_MIXED_STEP))
            continue
        if p.tokens > max_tokens.get(mode, p.tokens):
            rows.append(dict(row, status=f"skipped: over {max_tokens[mode]} tokens in this mode"))
            continue
        kw = dict(decodes=p.decodes, decode_context=p.decode_context) if p.phase == "mixed" else {}
        try:
            fn, before = MODES[mode](model, p.batch, p.new_tokens, p.context, **kw)
            t = time_fn(fn, warmup=warmup, repeats=repeats, device=model.device, before_each=before)
            row.update(status="ok", **t.as_row())
            if hasattr(fn, "path"):  # the engine modes say whether the timed step replayed a graph
                row["path"] = fn.path()
            del fn, before
        except torch.OutOfMemoryError:
            row.update(status="oom")
        except getattr(torch, "AcceleratorError", ()):
            raise  # a device-side fault poisons the CUDA context: stop rather than record every later point as failed
        except (RuntimeError, ParameterError) as e:  # a mode that cannot run this point is reported as such
            row.update(status=f"error: {str(e).splitlines()[0][:120]}")
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
    df = pd.DataFrame(
        rows,
        columns=None
        if rows
        else [
            "model",
            "mode",
            "phase",
            "batch",
            "new_tokens",
            "context",
            "decodes",
            "decode_context",
            "flops",
            "bytes",
            "status",
        ],
    )
    ok = df["status"] == "ok"
    if ok.any():
        tokens = df["batch"] * df["new_tokens"] + df["decodes"]
        df.loc[ok, "us_per_token"] = df.loc[ok, "median_ms"] * 1e3 / tokens[ok]
        df.loc[ok, "floor_ms"] = roofline.floor_ms(df.loc[ok, "flops"], df.loc[ok, "bytes"])
        df.loc[ok, "bound"] = roofline.bound(df.loc[ok, "flops"], df.loc[ok, "bytes"])
        df.loc[ok, "pct_of_floor"] = roofline.pct_of_floor(
            df.loc[ok, "median_ms"], df.loc[ok, "flops"], df.loc[ok, "bytes"]
        )
        df.loc[ok, "achieved_tflop_s"] = roofline.achieved_tflop_s(df.loc[ok, "median_ms"], df.loc[ok, "flops"])
        df.loc[ok, "achieved_gb_s"] = roofline.achieved_gb_s(df.loc[ok, "median_ms"], df.loc[ok, "bytes"])
    return df
