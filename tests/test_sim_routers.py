"""Routers and the capacity search."""

import numpy as np
import pandas as pd
import pytest
from sim_fixtures import COST

from servelab.errors import ParameterError
from servelab.loadgen.lengths import UniformLengths
from servelab.loadgen.workload import Trace
from servelab.sim import make_router, simulate
from servelab.sim.capacity import meets_slo, replicas_needed, single_replica_rate
from servelab.sim.prefix_workload import with_shared_prefixes
from servelab.sim.routers import prefix_keys


class Rep:
    def __init__(self, n):
        self.outstanding = n


def test_round_robin_and_least_outstanding():
    reps = [Rep(0), Rep(0), Rep(0)]
    rr = make_router("round_robin", reps)
    assert [rr.route(i) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    lo = make_router("least_outstanding", [Rep(3), Rep(1), Rep(1), Rep(2)])
    assert lo.route(0) == 1  # ties: lowest index


def test_prefix_affinity_keys_on_the_prefix_and_falls_back_when_overloaded():
    ids = [[1, 2, 3, 9], [1, 2, 3, 7], [4, 5, 6, 9]]
    keys = prefix_keys(ids, 3)
    assert keys[0] == keys[1] != keys[2]
    reps = [Rep(0), Rep(0), Rep(0), Rep(0)]
    r = make_router("prefix_affinity", reps, prompt_ids=ids, prefix_k=3, max_imbalance=2)
    home = r.route(0)
    assert r.route(1) == home
    reps[home].outstanding = 5  # far ahead of the least loaded
    assert r.route(1) != home and r.num_fallbacks == 1


def test_router_errors():
    with pytest.raises(ParameterError, match="unknown router"):
        make_router("random", [Rep(0)])
    with pytest.raises(ParameterError, match="prompt token ids"):
        make_router("prefix_affinity", [Rep(0)])
    with pytest.raises(ParameterError, match="replicas"):
        simulate(pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [5], "output_tokens": [2]}), cost=COST, replicas=0)


def test_affinity_routes_a_group_to_one_replica_in_a_simulation():
    t = Trace.synthetic(rate=20, lengths=UniformLengths(40, 60, 4, 8), n=60, seed=0)
    t = with_shared_prefixes(t, groups=3, prefix_tokens=16, seed=0, materialize=True)
    rec = simulate(t, cost=COST, replicas=4, router="prefix_affinity", prefix_k=16).records
    per_group = rec.assign(g=t.frame["prefix_group"]).groupby("g")["replica"].nunique()
    assert (per_group == 1).all()  # light load: no fallback
    # keyed on 32 tokens, the random tails after the 16 shared ones scatter each group
    rec = simulate(t, cost=COST, replicas=4, router="prefix_affinity", prefix_k=32).records
    assert (rec.assign(g=t.frame["prefix_group"]).groupby("g")["replica"].nunique() > 1).any()


def test_least_outstanding_beats_round_robin_on_skewed_lengths():
    rng = np.random.default_rng(0)
    n = 400
    out = np.where(np.arange(n) % 2 == 0, 200, 2)  # round robin with 2 replicas sends every long one to replica 0
    t = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 80, n)), "prompt_tokens": 50, "output_tokens": out})
    rr = simulate(t, cost=COST, replicas=2, router="round_robin", token_times=False).summary()
    lo = simulate(t, cost=COST, replicas=2, router="least_outstanding", token_times=False).summary()
    assert lo["e2e_p99_ms"] < rr["e2e_p99_ms"]


def test_capacity_search():
    lengths = UniformLengths(50, 150, 10, 30)
    make = lambda rate: Trace.synthetic(rate=rate, lengths=lengths, duration_s=2.0, seed=1)  # noqa: E731
    slo = dict(slo_ttft_ms=60.0, slo_tpot_ms=6.0)
    one = single_replica_rate(make, cost=COST, **slo, start=8.0, refine=1, max_num_batched_tokens=512)
    assert one > 8
    needed, tried = replicas_needed(
        make,
        [one, 3 * one],
        ["round_robin", "least_outstanding"],
        cost=COST,
        max_replicas=16,
        max_num_batched_tokens=512,
        **slo,
    )
    asked = {(router, rate) for router in ("round_robin", "least_outstanding") for rate in (one, 3 * one)}
    # every router at every rate: the loops below see each answer (an empty one would pass them)
    assert len(needed) == len(asked) and set(zip(needed.router, needed.rate, strict=True)) == asked
    assert needed["met"].all()
    for _, g in needed.groupby("router"):
        assert g.sort_values("rate")["replicas"].is_monotonic_increasing
        assert g["replicas"].iloc[-1] >= 2
    # the answer is minimal: one replica fewer was tried and missed the SLO (unless the answer is 1)
    for row in needed.itertuples():
        if row.replicas > 1:
            fewer = tried[
                (tried.router == row.router) & (tried.rate == row.rate) & (tried.replicas == row.replicas - 1)
            ]
            assert len(fewer) == 1 and not fewer["met"].iloc[0]
    with pytest.raises(ParameterError, match="slo_ttft_ms"):
        replicas_needed(make, [1.0], ["round_robin"], cost=COST, slo_ttft_ms=0, slo_tpot_ms=1)


def test_meets_slo():
    s = {"failed": 0, "ttft_p99_ms": 10.0, "tpot_p99_ms": 2.0}
    assert meets_slo(s, 10.0, 2.0) and not meets_slo(s, 9.0, 2.0) and not meets_slo({**s, "failed": 1}, 10, 2)


def test_capacity_search_respects_its_time_budget():
    make = lambda rate: Trace.synthetic(rate=rate, lengths=UniformLengths(50, 150, 10, 30), duration_s=1.0, seed=1)  # noqa: E731
    needed, tried = replicas_needed(
        make, [10.0, 20.0], ["round_robin"], cost=COST, slo_ttft_ms=60.0, slo_tpot_ms=6.0, time_budget_s=0.0
    )
    assert tried.empty and (needed["status"] == "skipped: time budget").all() and not needed["met"].any()
