"""Fused decode runs are an optimisation only: the simulation with them equals the step-by-step one exactly,
for every policy, under KV-block pressure, across replicas and routers; and a simulation is deterministic."""

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.sim import StepCostModel, simulate
from servelab.sim.cost_model import CostModel

COST = StepCostModel(
    gpu=CostModel(
        "m",
        "test",
        {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
        {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4},
        {},
    ),
    step_overhead_ms=0.4,
    seq_overhead_ms=0.02,
    ingress_ms=1.5,
    # the longest walks priced, so that a fused run's closed form must track the longest sequence
    ms_per_longest_context_token=1e-3,
    ms_per_decode_walk_token=2e-4,
)


def _trace(n, rate, seed, prompt=(4, 300), output=(1, 120), groups=None):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
            "prompt_tokens": rng.integers(*prompt, n),
            "output_tokens": rng.integers(*output, n),
        }
    )
    if groups:
        df["prefix_group"] = rng.integers(0, groups, n)
    return df


def _same(a, b):
    # equal up to float rounding: a fused run sums its step times with cumsum, single steps one by one
    cols = ["first_token_s", "finish_s", "output_tokens", "ok", "replica"]
    pd.testing.assert_frame_equal(a.records[cols], b.records[cols], check_exact=False, rtol=1e-12, atol=1e-9)
    ta, tb = a.records["token_times_s"], b.records["token_times_s"]
    assert [len(x) for x in ta] == [len(x) for x in tb]
    np.testing.assert_allclose(
        np.concatenate([np.asarray(x, float) for x in ta] + [[]]),
        np.concatenate([np.asarray(x, float) for x in tb] + [[]]),
        rtol=1e-12,
        atol=1e-9,
    )


@pytest.mark.parametrize(
    "policy,budget", [("chunked_prefill", 64), ("chunked_prefill", 512), ("eager_cont_batch", 512), ("fcfs", 512)]
)
@pytest.mark.parametrize("blocks", [40, 4096])
def test_fused_equals_step_by_step(policy, budget, blocks):
    trace = _trace(120, rate=60, seed=1, prompt=(4, 200), output=(1, 120))
    kw = dict(
        cost=COST,
        scheduler=policy,
        max_num_seqs=16,
        max_num_batched_tokens=budget,
        num_blocks=blocks,
        block_size=16,
        step_log=True,
    )
    fused = simulate(trace, fast_forward=True, **kw)
    plain = simulate(trace, fast_forward=False, **kw)
    _same(fused, plain)
    assert fused.records["ok"].all()
    assert fused.num_steps == plain.num_steps
    assert (fused.steps["decode_steps"] > 1).any(), "expected some fused runs"
    if blocks == 40 and policy != "fcfs":
        assert fused.steps["num_preempted"].sum() > 0, "the small pool should force preemptions"


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "prefix_affinity"])
def test_fused_equals_step_by_step_on_a_cluster(router):
    trace = _trace(300, rate=200, seed=2, groups=5)
    kw = dict(cost=COST, replicas=3, router=router, max_num_seqs=32, max_num_batched_tokens=256)
    _same(simulate(trace, fast_forward=True, **kw), simulate(trace, fast_forward=False, **kw))


def test_deterministic_and_records_schema():
    trace = _trace(200, rate=100, seed=3, groups=4)
    a = simulate(trace, cost=COST, replicas=2, router="least_outstanding")
    b = simulate(trace, cost=COST, replicas=2, router="least_outstanding")
    _same(a, b)
    r = a.records
    assert list(r.columns[:10]) == [
        "request_id",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "sent_s",
        "first_token_s",
        "finish_s",
        "token_times_s",
        "ok",
        "error",
    ]
    assert (r["output_tokens"] == trace["output_tokens"]).all()
    assert (r["first_token_s"] >= r["sent_s"] + COST.ingress_ms / 1e3).all()
    assert all(
        len(t) == n and np.all(np.diff(t) > 0) for t, n in zip(r["token_times_s"], r["output_tokens"], strict=True)
    )
    s = a.summary()
    assert s["completed"] == 200 and s["failed"] == 0 and s["ttft_p50_ms"] > 0


def test_compact_mode_matches_full_mode():
    trace = _trace(150, rate=80, seed=4)
    full = simulate(trace, cost=COST, replicas=2)
    lean = simulate(trace, cost=COST, replicas=2, token_times=False)
    a, b = full.summary(), lean.summary()
    for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p99_ms", "e2e_p90_ms", "max_itl_ms", "throughput_tok_s", "completed"):
        assert a[k] == pytest.approx(b[k], rel=1e-9), k
    assert np.isnan(b["itl_p50_ms"])


def test_one_token_step_matches_cost_model():
    # one request alone: its prefill step, then decode steps whose durations the cost model gives
    trace = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [100], "output_tokens": [4]})
    r = simulate(trace, cost=COST).records.iloc[0]
    t0 = COST.ingress_ms / 1e3
    pre = COST.step_ms(100, 100 * 50, 0, 0, 1) / 1e3
    assert r["first_token_s"] == pytest.approx(t0 + pre)
    gaps = np.diff(r["token_times_s"]) * 1e3
    assert gaps == pytest.approx([COST.step_ms(0, 0, 1, 100 + j, 1, 0.0, 100 + j) for j in range(3)])


def test_refused_request_is_a_failed_record():
    # EagerContBatch does not chunk: a request longer than the budget can never run; the server answers 400
    trace = pd.DataFrame({"arrival_s": [0.0, 0.1], "prompt_tokens": [10, 900], "output_tokens": [5, 5]})
    r = simulate(trace, cost=COST, scheduler="eager_cont_batch", max_num_batched_tokens=512).records
    assert r["ok"].tolist() == [True, False]
    assert "max_num_batched_tokens" in r["error"].iloc[1]


def _prefix_trace(n, rate, seed, groups=6, prefix=64):
    rng = np.random.default_rng(seed)
    heads = rng.integers(0, 1000, (groups, prefix))
    t = _trace(n, rate, seed, prompt=(prefix + 1, prefix + 200), output=(1, 80))
    g = rng.integers(0, groups, n)
    t["prompt_ids"] = [
        heads[k].tolist() + rng.integers(0, 1000, int(p) - prefix).tolist()
        for k, p in zip(g, t["prompt_tokens"], strict=True)
    ]
    return t


@pytest.mark.parametrize("blocks", [60, 4096])
def test_fused_equals_step_by_step_with_prefix_caching(blocks):
    trace = _prefix_trace(150, rate=80, seed=6)
    kw = dict(
        cost=COST,
        replicas=2,
        router="prefix_affinity",
        max_num_seqs=16,
        max_num_batched_tokens=256,
        num_blocks=blocks,
        prefix_caching=True,
    )
    fused, plain = simulate(trace, fast_forward=True, **kw), simulate(trace, fast_forward=False, **kw)
    _same(fused, plain)
    assert fused.prefix_hit_rate == plain.prefix_hit_rate > 0.1


def test_prefix_affinity_raises_the_hit_rate_and_saves_prefill():
    trace = _prefix_trace(400, rate=150, seed=7, groups=8, prefix=160)
    kw = dict(
        cost=COST,
        replicas=4,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        prefix_caching=True,
        prefix_k=160,
        step_log=True,
    )
    rr = simulate(trace, router="round_robin", **kw)
    pa = simulate(trace, router="prefix_affinity", **kw)
    assert pa.prefix_hit_rate > rr.prefix_hit_rate
    assert pa.steps["prefill_tokens"].sum() < rr.steps["prefill_tokens"].sum()
    with pytest.raises(ParameterError, match="prompt_ids"):
        simulate(trace.drop(columns="prompt_ids"), cost=COST, prefix_caching=True)
