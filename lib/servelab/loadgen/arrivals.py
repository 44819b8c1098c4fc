"""Request arrival times (seconds from the run's start) for open-loop load.

vLLM's convention (``benchmark_serving.py --burstiness``): inter-arrival gaps are gamma-distributed with
shape = burstiness and scale = 1 / (rate × burstiness), so the mean rate is ``rate`` whatever the
burstiness; burstiness 1 is a Poisson process (exponential gaps), below 1 burstier, above 1 more regular.
A rate of ``inf`` sends every request at time 0 (a closed burst). Replaying a trace's own arrival times
is ``servelab.loadgen.workload.Trace.read_jsonl``.
"""

from __future__ import annotations

import math

import numpy as np

from servelab.errors import ParameterError


def _check(rate, burstiness, n) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ParameterError(f"rate must be a positive number of requests/s (or inf), got {rate!r}")
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not 0 < burstiness < math.inf:
        raise ParameterError(f"burstiness must be a positive finite number, got {burstiness!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ParameterError(f"number of requests must be a non-negative integer, got {n!r}")


def gamma_arrivals(rate: float, n: int, rng: np.random.Generator, burstiness: float = 1.0) -> np.ndarray:
    """``n`` arrival times (s), the first gap included (the first request does not arrive at exactly 0),
    with mean rate ``rate`` requests/s and the given burstiness."""
    _check(rate, burstiness, n)
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps)


def arrival_times(
    rate: float,
    rng: np.random.Generator,
    *,
    n: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    max_requests: int = 100_000,
) -> np.ndarray:
    """Arrival times (s) at ``rate`` requests/s with the given burstiness: either ``n`` of them, or every arrival
    within ``duration_s`` seconds (at least one, at most ``max_requests``)."""
    if (n is None) == (duration_s is None):
        raise ParameterError("give exactly one of n (requests) or duration_s (seconds of arrivals)")
    if n is not None:
        return gamma_arrivals(rate, n, rng, burstiness)
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
        raise ParameterError(f"duration_s must be a positive number, got {duration_s!r}")
    if math.isinf(rate):
        raise ParameterError("an infinite rate needs n (requests), not a duration")
    chunk = int(rate * duration_s * 1.5 + 10 * math.sqrt(rate * duration_s) + 10)
    arrivals = gamma_arrivals(rate, chunk, rng, burstiness)
    while arrivals[-1] <= duration_s and len(arrivals) < max_requests:  # bursty gaps can fall short
        arrivals = np.concatenate([arrivals, arrivals[-1] + gamma_arrivals(rate, chunk, rng, burstiness)])
    return arrivals[arrivals <= duration_s][:max_requests] if arrivals[0] <= duration_s else arrivals[:1]


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` Poisson arrival times (s) at ``rate`` requests/s: gamma arrivals with burstiness 1."""
    return gamma_arrivals(rate, n, rng, 1.0)
