"""Timing with CUDA events (or ``perf_counter`` on the CPU), warm-up, repeats and robust statistics.

Each repeat is bracketed by its own pair of CUDA events recorded on the current stream; we
synchronise once after all repeats, so host-side bookkeeping never lands inside a measurement,
and read ``elapsed_time`` only after the device has finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings, all in milliseconds."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    ci_low_ms: float
    ci_high_ms: float
    min_ms: float
    repeats: int
    clock: str  # "cuda_event" or "perf_counter"

    @property
    def iqr_ms(self) -> float:
        return self.p75_ms - self.p25_ms

    def as_row(self, prefix: str = "") -> dict:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def summarize(samples_ms, clock: str = "cuda_event", confidence: float = 0.95) -> Timing:
    """Median, quartiles and a bootstrap confidence interval of the median (scipy)."""
    x = np.asarray(samples_ms, dtype=float)
    if x.size == 0:
        raise ValueError("summarize() needs at least one sample")
    if not np.all(np.isfinite(x)):
        raise ValueError("timing samples contain NaN or inf")
    med = float(np.median(x))
    if x.size >= 3 and np.ptp(x) > 0:
        ci = stats.bootstrap(
            (x,), np.median, confidence_level=confidence, n_resamples=999, method="percentile", random_state=0
        ).confidence_interval
        lo, hi = float(ci.low), float(ci.high)
    else:
        lo = hi = med
    return Timing(
        median_ms=med,
        p25_ms=float(np.percentile(x, 25)),
        p75_ms=float(np.percentile(x, 75)),
        ci_low_ms=lo,
        ci_high_ms=hi,
        min_ms=float(x.min()),
        repeats=int(x.size),
        clock=clock,
    )


def _on_cuda(device) -> bool:
    import torch

    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def time_fn(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device=None,
    before_each: Callable[[], object] | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    ``before_each`` runs untimed before every timed call (e.g. to reset a cache position or rotate
    inputs so that repeated runs do not measure the L2 cache).
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    import torch

    cuda = _on_cuda(device)
    for _ in range(warmup):
        if before_each is not None:
            before_each()
        fn()
    if cuda:
        torch.cuda.synchronize()
        events = []
        for _ in range(repeats):
            if before_each is not None:
                before_each()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) for s, e in events]
        return summarize(samples, clock="cuda_event")
    samples = []
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples, clock="perf_counter")
