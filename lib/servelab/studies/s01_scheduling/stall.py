"""The worst decode stall of a run as a statistic: the p99 of the per-request maximum inter-token gap, with a
bootstrap interval over requests, beside the single maximum.

A run's single largest gap is one sample: one unlucky step decides it, and a re-run moves it (F1.1's top-rate stall
for qwen2-0.5b went from 150.8 to 251.1 ms between two H200 runs). Each completed request's own worst gap is one
observation per request; their 99th percentile describes the stall that 1% of requests meet, and resampling the
requests (with replacement) gives its interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.errors import ParameterError

QUANTILE = 99.0  # percent
BOOTSTRAP = 1000  # resamples
LEVEL = 0.95  # the interval's coverage
STALL_COLUMNS = ("max_itl_p99_ms", "max_itl_p99_lo_ms", "max_itl_p99_hi_ms", "stall_requests")


def p99_of_max_itl(per_request_max_ms, *, resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """The p99 (ms, numpy's linear interpolation) of the per-request maximum ITLs and its 95% percentile-bootstrap
    interval over requests (``resamples`` resamples, deterministic given ``seed``); NaN-valued requests (fewer than
    two tokens) are left out. Keys: ``STALL_COLUMNS`` (``stall_requests``: how many requests it rests on). With
    fewer than two requests the interval is NaN: one request has no spread to resample."""
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ParameterError(f"resamples must be a positive integer, got {resamples!r}")
    x = np.asarray(per_request_max_ms, dtype=float)
    x = x[~np.isnan(x)]
    nan = float("nan")
    if x.size == 0:
        return dict(zip(STALL_COLUMNS, (nan, nan, nan, 0), strict=True))
    p = float(np.percentile(x, QUANTILE))
    if x.size < 2:
        return dict(zip(STALL_COLUMNS, (p, nan, nan, 1), strict=True))
    rng = np.random.default_rng(seed)
    boot = np.percentile(x[rng.integers(0, x.size, size=(resamples, x.size))], QUANTILE, axis=1)
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return dict(zip(STALL_COLUMNS, (p, float(lo), float(hi), int(x.size)), strict=True))


def per_request_max_itl_ms(requests: pd.DataFrame) -> pd.Series:
    """Each completed request's largest gap between two of its tokens (ms; NaN with fewer than two tokens), from
    records whose ``token_times_s`` are lists or their CSV text."""
    from servelab.loadgen.metrics import request_metrics

    m = request_metrics(requests)
    return m.loc[m["ok"], "max_itl_ms"]


KEYS = ["model", "scheduler", "budget", "rate_fraction", "sweep"]


def stall_stats(requests: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """``STALL_COLUMNS`` per load point (``KEYS``) of a study's ``requests`` table: for results written before the
    summary carried them (the committed H200 run), computed the same way ``sweep.run_point`` does."""
    rows = []
    for key, g in requests.groupby(KEYS, sort=False):
        cols = g.drop(columns=KEYS + ["rate", "t0_perf_s"], errors="ignore").reset_index(drop=True)
        rows.append({**dict(zip(KEYS, key, strict=True)), **p99_of_max_itl(per_request_max_itl_ms(cols), seed=seed)})
    return pd.DataFrame(rows, columns=KEYS + list(STALL_COLUMNS))


def with_stall_stats(summary: pd.DataFrame, requests: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """``summary`` with ``STALL_COLUMNS`` filled from ``requests`` where it lacks them (older runs)."""
    if set(STALL_COLUMNS) <= set(summary.columns):
        return summary
    return summary.merge(stall_stats(requests, seed=seed), on=KEYS, how="left")
