"""Capacity planning: how many replicas a request rate needs to meet an SLO, per router.

An SLO here is a bound on the p99 TTFT and the p99 TPOT (ms) of the simulated requests (vLLM's goodput
convention). For each router and rate the search starts from the previous (lower) rate's answer, since more
traffic never needs fewer replicas: it starts at the previous answer scaled by the rate ratio (less 10 %),
removes replicas while the SLO still holds and adds them until it does, up to ``max_replicas``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.sim.cost_model import StepCostModel
from servelab.sim.simulator import simulate


def meets_slo(summary: dict, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """Whether p99 TTFT and p99 TPOT are within the SLO and every request completed."""
    return summary["failed"] == 0 and summary["ttft_p99_ms"] <= slo_ttft_ms and not summary["tpot_p99_ms"] > slo_tpot_ms


def simulate_point(trace, *, cost, replicas: int, router: str, slo_ttft_ms: float, slo_tpot_ms: float, **sim_kwargs):
    """One simulated point of a capacity search: ``(met, summary, run)`` of ``trace`` on ``replicas`` replicas."""
    run = simulate(trace, cost=cost, replicas=replicas, router=router, token_times=False, **sim_kwargs)
    s = run.summary(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    return meets_slo(s, slo_ttft_ms, slo_tpot_ms), s, run


class _RouterSearch:
    """One router's search: ``fewest(rate, ...)`` simulates as few points as it can; each goes to ``tried``."""

    def __init__(self, router: str, traces: dict, tried: list, *, cost, slo_ttft_ms, slo_tpot_ms, max_replicas, kw):
        self.router, self.traces, self.tried = router, traces, tried
        self.cost, self.slo_ttft_ms, self.slo_tpot_ms = cost, slo_ttft_ms, slo_tpot_ms
        self.max_replicas, self.kw = max_replicas, kw
        self.cache: dict[tuple[float, int], bool] = {}

    def ok(self, rate: float, n: int) -> bool:
        """Whether ``n`` replicas meet the SLO at ``rate`` (simulated once per point)."""
        if (rate, n) not in self.cache:
            met, s, run = simulate_point(
                self.traces[rate], cost=self.cost, replicas=n, router=self.router, slo_ttft_ms=self.slo_ttft_ms,
                slo_tpot_ms=self.slo_tpot_ms, **self.kw,
            )  # fmt: skip
            self.cache[(rate, n)] = met
            self.tried.append(
                {
                    "router": self.router,
                    "rate": rate,
                    "replicas": n,
                    "met": self.cache[(rate, n)],
                    "ttft_p99_ms": s["ttft_p99_ms"],
                    "tpot_p99_ms": s["tpot_p99_ms"],
                    "goodput_req_s": s["goodput_req_s"],
                    "requests": len(run.records),
                    "sim_wall_s": run.wall_s,
                }
            )
        return self.cache[(rate, n)]

    def fewest(self, rate: float, prev_rate: float | None, prev_n: int) -> tuple[bool, int]:
        """``(met, replicas)`` at ``rate``, searched from the lower rate's answer ``prev_n`` (see the module
        docstring); ``met`` False when even ``max_replicas`` do not meet the SLO."""
        top = self.max_replicas
        if prev_n > top:
            return False, prev_n  # a lower rate already needed more than max_replicas
        floor_n = prev_n
        n = max(floor_n, int(prev_n * rate / prev_rate * 0.9)) if prev_rate else 1
        n = min(n, top)
        if self.ok(rate, n):
            while n > floor_n and self.ok(rate, n - 1):
                n -= 1
            return True, n
        while n < top:
            n += 1
            if self.ok(rate, n):
                return True, n
        return False, n


def _check_search(slo_ttft_ms, slo_tpot_ms, max_replicas, rates, routers) -> None:
    for name, v in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{name} must be a positive number of ms, got {v!r}")
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise ParameterError(f"max_replicas must be a positive integer, got {max_replicas!r}")
    if not rates or not routers:
        raise ParameterError("need at least one rate and one router")


def replicas_needed(
    make_trace: Callable[[float], object],
    rates: Iterable[float],
    routers: Iterable[str],
    *,
    cost: StepCostModel,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
    max_replicas: int = 64,
    time_budget_s: float | None = None,
    progress: bool = False,
    **sim_kwargs,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(needed, tried)``: per router and rate the fewest replicas that meet the SLO (``replicas`` NaN and
    ``met`` False when even ``max_replicas`` do not), and every (router, rate, replicas) simulated with its
    p99 TTFT and TPOT. ``make_trace(rate)`` builds the trace of one rate (the same for every router).
    Once ``time_budget_s`` (wall seconds) is spent, the remaining points are recorded as skipped
    (``status``) instead of searched."""
    rates = sorted(float(r) for r in rates)
    routers = list(routers)
    _check_search(slo_ttft_ms, slo_tpot_ms, max_replicas, rates, routers)
    t_end = time.perf_counter() + time_budget_s if time_budget_s is not None else None
    traces = {r: make_trace(r) for r in rates}
    from tqdm.auto import tqdm

    bar = tqdm(total=len(rates) * len(routers), desc="capacity search", unit="point", disable=not progress)
    needed, tried = [], []
    slo = {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms}
    for router in routers:
        search = _RouterSearch(router, traces, tried, cost=cost, max_replicas=max_replicas, kw=sim_kwargs, **slo)
        prev_rate, prev_n = None, 1
        for rate in rates:
            if t_end is not None and time.perf_counter() > t_end:
                met, n, status = False, np.nan, "skipped: time budget"
            else:
                met, n = search.fewest(rate, prev_rate, prev_n)
                if prev_n <= max_replicas:
                    prev_rate, prev_n = rate, (n if met else max_replicas + 1)
                status = "ok" if met else f"not met with {max_replicas} replicas"
            needed.append(
                {"router": router, "rate": rate, "replicas": n if met else np.nan, "met": met, **slo, "status": status}
            )
            bar.update(1)
    bar.close()
    return pd.DataFrame(needed), pd.DataFrame(tried)


def default_slo(cost: StepCostModel, mean_prompt_tokens: float, mean_output_tokens: float) -> tuple[float, float]:
    """An SLO scaled to the model's own speed, ``(ttft_ms, tpot_ms)``: TTFT within 10× the time to prefill a
    mean prompt alone (plus ingress), TPOT within 5× a decode step of one sequence at the mean context (the
    factor 5 follows Sarathi-Serve's "strict" tail-latency SLO, set relative to the model's own step time)."""
    p = float(mean_prompt_tokens)
    prefill = cost.step_ms(int(p), p * p / 2, 0, 0, 1) + cost.ingress_ms
    ctx = int(p + mean_output_tokens / 2)
    decode = cost.step_ms(0, 0.0, 1, ctx, 1, 0.0, ctx)  # one sequence: it is also the longest
    return 10 * prefill, 5 * decode


def rate_bracket(
    make_trace: Callable[[float], object],
    *,
    cost: StepCostModel,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
    start: float = 1.0,
    replicas: int = 1,
    router: str = "round_robin",
    steps: int = 14,
    refine: int = 3,
    down: bool = True,
    record: Callable[[float, bool, dict, object], None] | None = None,
    **sim_kwargs,
) -> tuple[float, float]:
    """``(met, missed)``: the highest request rate (req/s) found within the SLO on ``replicas`` replicas behind
    ``router`` and the lowest found outside it, within a factor 2^(1/2^refine) of each other: doubling from
    ``start`` while it meets (or, with ``down``, halving while it misses), ``steps`` times at most, then bisection
    in log space. ``met`` is NaN when nothing tried met, ``missed`` inf when nothing tried missed (then no
    bisection). ``record(rate, met, summary, run)`` sees every simulated point."""

    def ok(rate: float) -> bool:
        met, s, run = simulate_point(
            make_trace(rate), cost=cost, replicas=replicas, router=router, slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms, **sim_kwargs,
        )  # fmt: skip
        if record is not None:
            record(rate, met, s, run)
        return met

    return bracket_search(ok, start=start, steps=steps, refine=refine, down=down)


def bracket_search(
    ok: Callable[[float], bool], *, start: float, steps: int = 14, refine: int = 3, down: bool = True
) -> tuple[float, float]:
    """``(met, missed)`` of any point that meets an SLO or not (``ok(rate)``: simulated, or measured on a real
    server): doubling from ``start`` while it meets (with ``down``, halving while it misses), ``steps`` times at
    most, then ``refine`` bisections in log space. NaN / inf where nothing tried met / missed."""
    lo, hi, rate = float("nan"), float("inf"), start
    if ok(rate):
        lo = rate
        for _ in range(steps):
            rate *= 2
            if not ok(rate):
                hi = rate
                break
            lo = rate
    else:
        hi = rate
        for _ in range(steps if down else 0):
            rate /= 2
            if ok(rate):
                lo = rate
                break
            hi = rate
    if np.isfinite(lo) and np.isfinite(hi):
        for _ in range(refine):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, hi


def single_replica_rate(
    make_trace: Callable[[float], object],
    *,
    cost: StepCostModel,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
    start: float = 1.0,
    doublings: int = 14,
    refine: int = 3,
    **sim_kwargs,
) -> float:
    """The highest request rate (req/s) one replica serves within the SLO, to a factor 2^(1/2^refine):
    doubling from ``start``, then bisection in log space. NaN when even ``start`` fails."""
    met, _ = rate_bracket(
        make_trace, cost=cost, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, start=start, steps=doublings,
        refine=refine, down=False, **sim_kwargs,
    )  # fmt: skip
    return met
