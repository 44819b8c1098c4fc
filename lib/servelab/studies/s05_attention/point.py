"""One measured point: a variant at a shape, checked, then measured, or recorded as why not.

Order: build (untimed; compile time recorded) → first call, compared with the float64 reference
(a variant whose error exceeds its dtype's tolerance is recorded ``incorrect`` and not timed) → peak
memory of one call → timing (CUDA events, median and quartiles over repeats, after warm-up).

Every failure becomes a row with a ``status`` instead of an exception, so a sweep always finishes:
``unsupported`` (the variant or backend refuses the shape), ``oom``, ``incorrect``, ``error``, and
``untimed`` (correct, but an eager CPU fallback whose time would mean nothing).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from dataclasses import dataclass

from servelab.measure import time_fn
from servelab.studies.s05_attention.backends import picked_backend
from servelab.studies.s05_attention.memory import peak_bytes
from servelab.studies.s05_attention.reference import check_output
from servelab.studies.s05_attention.shapes import AttentionShape
from servelab.studies.s05_attention.variants import Unavailable, Variant

STATUSES = ("ok", "untimed", "incorrect", "unsupported", "oom", "error", "skipped")


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time each point: repeats sized so one point takes about ``target_ms`` of device time."""

    target_ms: float = 200.0
    min_repeats: int = 3
    max_repeats: int = 30
    warmup: int = 2

    def repeats_for(self, call_ms: float) -> int:
        if call_ms <= 0:
            return self.max_repeats
        return int(min(self.max_repeats, max(self.min_repeats, self.target_ms // call_ms)))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _warned(said) -> str:
    """The distinct first lines of recorded warnings, '; '-joined (why a backend refused)."""
    lines = (str(w.message).strip().splitlines() for w in said)
    return "; ".join(dict.fromkeys(x[0][:160] for x in lines if x))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _timed(attn, sets: list, policy: TimingPolicy, device):
    """Time ``attn`` over repeats sized from one untimed call, cycling through the input ``sets`` between calls."""
    _sync(device)
    t0 = time.perf_counter()
    attn(*sets[0])
    _sync(device)
    call_ms = (time.perf_counter() - t0) * 1e3
    turn = [0]

    def next_set():
        turn[0] = (turn[0] + 1) % len(sets)

    return time_fn(
        lambda: attn(*sets[turn[0]]),
        warmup=policy.warmup,
        repeats=policy.repeats_for(call_ms),
        device=device,
        before_each=next_set if len(sets) > 1 else None,
    )


def _failure(e: Exception, stage: str, said) -> dict:
    """The row's ``status`` and ``reason`` for an exception raised at ``stage`` (``said``: warnings recorded)."""
    import torch

    if isinstance(e, Unavailable):
        return dict(status="unsupported", reason=str(e))
    if isinstance(e, torch.OutOfMemoryError):
        return dict(status="oom", reason=f"out of memory at {stage}: {_first_line(e)[:160]}")
    if isinstance(e, RuntimeError):
        # a forced SDPA backend that refuses its inputs raises here ("No available kernel"); why it refused
        # it said in a warning just before, which is the useful part
        refused = stage == "first call" and ("kernel" in str(e).lower() or "backend" in str(e).lower())
        why = _warned(said)
        return dict(
            status="unsupported" if refused else "error",
            reason=f"at {stage}: {_first_line(e)}" + (f" ({why})" if why else ""),
        )
    return dict(status="error", reason=f"at {stage}: {_first_line(e)}")


def measure_point(
    variant: Variant,
    shape: AttentionShape,
    inputs,
    reference,
    rows,
    *,
    dtype,
    device,
    policy: TimingPolicy = TimingPolicy(),
    detect_backend: bool = True,
    rotation=(),
) -> dict:
    """Check and measure ``variant`` on ``inputs`` (q, k, v) of ``shape``; returns one tidy row.

    ``reference`` holds the float64 outputs of query ``rows`` for the first ``reference.shape[0]``
    sequences (shared by all variants on these inputs). ``rotation``: extra (q, k, v) sets the timed
    calls cycle through, so that small inputs are read from HBM and not from the L2 cache.
    Times are in ms, memory in bytes, FLOPs counted over the allowed (query, key) pairs only.
    """
    import torch

    device = torch.device(device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    row = dict(
        variant=variant.name,
        family=variant.family,
        implementation=variant.implementation(device),
        **shape.describe(),
        dtype=str(dtype).replace("torch.", ""),
        backend=variant.backend or "",
        flops=shape.flops,
        min_bytes=shape.min_bytes(itemsize),
        kv_bytes=shape.kv_bytes(itemsize),
        input_bytes=shape.input_bytes(itemsize),
        status="ok",
        reason="",
        rel_error=float("nan"),
        tolerance=float("nan"),
        build_s=float("nan"),
        gqa="",
        peak_mem_bytes=float("nan"),
        peak_mem_incl_inputs_bytes=float("nan"),
    )
    q, k, v = inputs
    stage, said = "build", []
    attn = out = None
    with contextlib.ExitStack() as stack:
        try:
            t0 = time.perf_counter()
            attn = variant.build(shape, device)
            if hasattr(attn, "held"):  # a forced SDPA backend: entered once for all the calls below
                stack.enter_context(attn.held())
            stage = "first call"
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                out = attn(q, k, v)  # compiles FlexAttention on first use: part of the build time
            _sync(device)
            row["build_s"] = time.perf_counter() - t0
            row["gqa"] = getattr(attn, "gqa", "native" if shape.arch.group > 1 else "mha")
            if row["gqa"].startswith("repeat_kv (") and said:  # keep why the backend refused enable_gqa
                row["reason"] = "enable_gqa refused: " + _warned(said)
            if variant.name in ("sdpa_default", "sdpa_repeat_kv") and detect_backend:
                row["backend"] = picked_backend(functools.partial(attn, q, k, v))
            stage = "correctness"
            check = check_output(out, q, k, v, shape.mask, reference=reference, rows=rows)
            out = None
            row.update(rel_error=check.rel_error, tolerance=check.tolerance)
            if not check.ok:
                row.update(status="incorrect", reason=f"relative error {check.rel_error:.2e} > {check.tolerance:.0e}")
                return row
            if row["implementation"] == "eager":
                # FlexAttention's CPU fallback: its time says nothing about the fused kernel, and the CPU's
                # tensor tracker cannot see inside its higher-order op; correctness is what CI can check
                row.update(status="untimed", reason="eager FlexAttention (no CUDA): correctness checked, not timed")
                return row
            stage = "memory"
            peak = peak_bytes(functools.partial(attn, q, k, v), device)
            row.update(peak_mem_bytes=peak, peak_mem_incl_inputs_bytes=peak + row["input_bytes"])
            stage = "timing"
            row.update(_timed(attn, [inputs, *rotation], policy, device).as_row())
        except Exception as e:  # a sweep records every failure and carries on
            row.update(_failure(e, stage, said))
    del attn, out  # drop the failed call's tensors before handing memory back
    if row["status"] == "oom":  # a full collection costs ~0.1–0.5 s: only worth it when memory ran out
        _free(device)
    return row
