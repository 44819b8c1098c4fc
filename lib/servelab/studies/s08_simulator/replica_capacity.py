"""How much traffic N replicas serve within the SLO, behind each router: the simulator's prediction that a
multi-GPU run is to be set beside (the "Beyond one GPU" page; issue 31).

The simulator page asks the inverse question (the fewest replicas a rate needs); a real cluster run measures the
other way round, a fixed number of GPUs under rising load, so this is what it will be compared with. For each
(router, N) the search brackets the capacity: the highest rate tried that met the SLO and the lowest that missed
it, doubling or halving from N times what one replica sustains, then bisecting in log space. Each point is one
simulation of a Poisson trace (``make_trace(rate, N)``: the caller sizes it, e.g. the same requests per replica
for every N); every point goes to ``tried``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from servelab.sim.capacity import rate_bracket

REPLICAS = (1, 2, 4)  # the replica counts of the page: what a 4-GPU machine can run
SINGLE = "(one replica)"  # the router column of N = 1, where routing cannot matter


def bracket(
    make_trace: Callable[[float, int], object],
    *,
    replicas: int,
    router: str,
    start: float,
    refine: int = 3,
    steps: int = 12,
    **search,
) -> tuple[float, float, list[dict]]:
    """``(met, missed, tried)``: ``capacity.rate_bracket`` on ``replicas`` replicas behind ``router``, from
    ``start``, halving where ``start`` misses; ``tried`` holds every simulated point."""
    tried: list[dict] = []

    def record(rate: float, met: bool, s: dict, run) -> None:
        tried.append(
            dict(router=router, replicas=replicas, rate=rate, met=met, ttft_p99_ms=s["ttft_p99_ms"],
                 tpot_p99_ms=s["tpot_p99_ms"], requests=len(run.records))
        )  # fmt: skip

    met, missed = rate_bracket(
        lambda rate: make_trace(rate, replicas), replicas=replicas, router=router, start=start, steps=steps,
        refine=refine, record=record, **search,
    )  # fmt: skip
    return met, missed, tried


def replica_capacity(
    make_trace: Callable[[float, int], object],
    routers: list[str],
    *,
    one: float,
    replicas: tuple[int, ...] = REPLICAS,
    **search,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(table, tried)``: per (router, N), the capacity bracket ``met_req_s``–``missed_req_s``, the capacity per
    replica, and the scaling over N single replicas (``met_req_s`` / (N · one replica's ``met_req_s``)). One
    replica is searched once (routing cannot matter), from ``one``; N replicas from N · ``one``."""
    rows, tried = [], []
    single = None
    for n in replicas:
        for router in [SINGLE] if n == 1 else routers:
            met, missed, t = bracket(
                make_trace, replicas=n, router=routers[0] if n == 1 else router, start=one * n, **search
            )
            tried += [{**row, "router": router} for row in t]
            single = met if n == 1 else single
            rows.append(dict(router=router, replicas=n, met_req_s=met, missed_req_s=missed))
    table = pd.DataFrame(rows)
    if not table.empty:
        table["per_replica_req_s"] = table["met_req_s"] / table["replicas"]
        table["scaling"] = table["met_req_s"] / (table["replicas"] * single) if single else math.nan
    return table, pd.DataFrame(tried)
