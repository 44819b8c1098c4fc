"""What cache-aware routing buys: the three routers over replicas that each keep the engine's prefix cache.

The workload is Study 7's server workload widened to a cluster: every request is one of ``prefixes`` system
prompts (Zipf popularity) plus a suffix of its own (``servelab.studies.s07_prefix_cache.serving.prefix_trace``).
Round-robin and least-outstanding spread each system prompt over every replica, so each replica's cache must hold
all of them; prefix affinity sends a prompt's requests to one replica (``servelab.sim.routers``), so each holds
about ``1/N`` of them. Whether that matters depends on the KV pool: the comparison runs each router with a pool that
holds every prefix and with one that holds only part of them, at request rates up to what the replicas serve.

Each point is one simulation with ``prefix_caching=True``: the engine's own ``PrefixCache`` (LRU) and block
manager in every replica. The caches start empty, as a freshly started cluster's would; the first request of a
prompt on each replica misses (``cold_misses`` says how many of the run's requests those are at most).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.sim.cost_model import StepCostModel
from servelab.sim.routers import ROUTERS
from servelab.sim.simulator import simulate
from servelab.studies.s07_prefix_cache.serving import prefix_trace


def affinity_trace(
    rate: float,
    *,
    requests: int,
    prefixes: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    alpha: float = 1.0,
    vocab: int = 32000,
    seed: int = 0,
):
    """The workload at ``rate`` req/s (a ``Trace`` with prompt ids)."""
    return prefix_trace(requests, rate, prefixes, alpha, prefix_tokens, suffix_tokens, output_tokens, vocab, seed)[0]


def compare_routers(
    make_trace,
    rates,
    *,
    cost: StepCostModel,
    replicas: int,
    pools,
    routers=ROUTERS,
    prefixes: int,
    progress: bool = False,
    **sim_kwargs,
) -> pd.DataFrame:
    """One row per pool size (KV blocks per replica), router and rate: hit rate, p50/p99 TTFT, p99 TPOT,
    goodput, requests, the simulation's wall time. ``make_trace(rate)`` builds one rate's trace (the same for
    every router and pool)."""
    for name, v in (("replicas", replicas), ("prefixes", prefixes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive integer, got {v!r}")
    pools, rates, routers = list(pools), sorted(float(r) for r in rates), list(routers)
    if not pools or not rates or not routers:
        raise ParameterError("need at least one pool size, one rate and one router")
    bar = None
    if progress:
        from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

        bar = tqdm(total=len(pools) * len(rates) * len(routers), desc="routers with prefix caches", unit="run")
    rows = []
    traces = {r: make_trace(r) for r in rates}
    for pool in pools:
        for router in routers:
            for rate in rates:
                t0 = time.perf_counter()
                run = simulate(
                    traces[rate],
                    cost=cost,
                    replicas=replicas,
                    router=router,
                    prefix_caching=True,
                    num_blocks=int(pool),
                    token_times=False,
                    **sim_kwargs,
                )
                s = run.summary()
                rows.append(
                    {
                        "pool_blocks": int(pool),
                        "router": router,
                        "rate": rate,
                        "replicas": replicas,
                        "requests": len(run.records),
                        "hit_rate": run.prefix_hit_rate,
                        "cold_misses": min(
                            len(run.records), prefixes * replicas if router != "prefix_affinity" else prefixes
                        ),
                        "ttft_p50_ms": s["ttft_p50_ms"],
                        "ttft_p99_ms": s["ttft_p99_ms"],
                        "tpot_p99_ms": s["tpot_p99_ms"],
                        "throughput_tok_s": s["throughput_tok_s"],
                        "failed": s["failed"],
                        "sim_wall_s": time.perf_counter() - t0,
                    }
                )
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return pd.DataFrame(rows)


def affinity_gain(table: pd.DataFrame) -> pd.DataFrame:
    """Per pool and rate: prefix affinity's hit rate and p99 TTFT against the best of the other routers."""
    out = []
    for (pool, rate), g in table.groupby(["pool_blocks", "rate"]):
        g = g.set_index("router")
        if "prefix_affinity" not in g.index or len(g) < 2:
            continue
        aff, others = g.loc["prefix_affinity"], g.drop(index="prefix_affinity")
        best = others["ttft_p99_ms"].idxmin()
        out.append(
            {
                "pool_blocks": pool,
                "rate": rate,
                "affinity_hit_rate": aff["hit_rate"],
                "best_other_hit_rate": float(others["hit_rate"].max()),
                "best_other": best,
                "affinity_ttft_p99_ms": aff["ttft_p99_ms"],
                "best_other_ttft_p99_ms": others.loc[best, "ttft_p99_ms"],
                "ttft_p99_ratio": aff["ttft_p99_ms"] / others.loc[best, "ttft_p99_ms"],
            }
        )
    return pd.DataFrame(out)


def pool_for_fraction(
    fraction: float, *, prefixes: int, prefix_tokens: int, private_tokens: int, block_size: int, max_num_seqs: int
) -> int:
    """KV blocks per replica that hold ``fraction`` of the prefixes' full blocks plus the private blocks
    (``private_tokens``: suffix and output) of ``max_num_seqs`` running requests; with ``fraction < 1`` no
    replica can cache every prefix."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not fraction > 0:
        raise ParameterError(f"pool fractions must be positive numbers, got {fraction!r}")
    per_prefix = prefix_tokens // block_size
    private = max_num_seqs * (-(-(prefix_tokens % block_size + private_tokens) // block_size) + 1)
    return int(np.ceil(fraction * prefixes * per_prefix)) + private
