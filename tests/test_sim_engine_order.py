"""The simulator drives the engine's own schedulers: on the same trace, with time counted in steps, a
simulated replica and the real engine (tiny model, CPU) give every request the same first-token and finish
step, for every policy, including runs where KV blocks run out and sequences are preempted."""

import numpy as np
import pandas as pd
import pytest
import torch

from servelab.engine import Engine, EngineConfig
from servelab.sim import StepCostModel, simulate
from servelab.sim.engine_replay import replay_on_engine


def _trace(n=14, seed=3):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "arrival_s": np.sort(rng.integers(0, 25, n)).astype(float),
            "prompt_tokens": rng.integers(3, 40, n),
            "output_tokens": rng.integers(1, 14, n),
        }
    )


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 2-layer model: more threads only contend with each other (20x slower on CI)
    yield Engine.from_spec(
        "config:tiny-llama", dtype="float32", device="cpu", config=EngineConfig(num_blocks=64, cuda_graphs=False)
    ).model
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "policy,seqs,budget,blocks",
    [
        ("chunked_prefill", 4, 16, 64),
        ("chunked_prefill", 8, 64, 9),  # few blocks: preemption by recompute
        ("eager_cont_batch", 4, 64, 64),
        ("eager_cont_batch", 8, 64, 12),
        ("fcfs", 3, 64, 64),
        ("fcfs", 8, 64, 7),
    ],
)
def test_same_schedule_as_engine(model, policy, seqs, budget, blocks):
    trace = _trace()
    cfg = EngineConfig(
        num_blocks=blocks,
        block_size=8,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        scheduler=policy,
        cuda_graphs=False,
    )
    engine = Engine(model, cfg)
    real, real_steps = replay_on_engine(engine, trace, clock="steps")
    assert real["ok"].all()
    for fast in (True, False):
        sim = simulate(
            trace,
            cost=StepCostModel.constant(1000.0),
            scheduler=policy,
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            num_blocks=blocks,
            block_size=8,
            fast_forward=fast,
        ).records
        np.testing.assert_array_equal(sim["first_token_s"].to_numpy(), real["first_token_s"].to_numpy())
        np.testing.assert_array_equal(sim["finish_s"].to_numpy(), real["finish_s"].to_numpy())
        assert [list(x) for x in sim["token_times_s"]] == [list(x) for x in real["token_times_s"]]
    if blocks < 16:
        assert engine.scheduler.num_preemptions > 0, "the tight pool should have forced a preemption"


def _shared_prefix_trace(n=14, seed=5, prefix=24):
    rng = np.random.default_rng(seed)
    heads = rng.integers(3, 500, (3, prefix))
    t = _trace(n, seed).assign(prompt_tokens=lambda d: d["prompt_tokens"] + prefix)
    t["prompt_ids"] = [
        heads[rng.integers(0, 3)].tolist() + rng.integers(3, 500, int(p) - prefix).tolist() for p in t["prompt_tokens"]
    ]
    return t


@pytest.mark.parametrize(
    "policy,budget,blocks",
    [
        ("chunked_prefill", 32, 64),
        ("chunked_prefill", 64, 14),
        ("eager_cont_batch", 128, 64),
        ("eager_cont_batch", 128, 16),
    ],
)
def test_same_schedule_as_engine_with_prefix_caching(model, policy, budget, blocks):
    trace = _shared_prefix_trace()
    cfg = EngineConfig(
        num_blocks=blocks,
        block_size=8,
        max_num_seqs=6,
        max_num_batched_tokens=budget,
        scheduler=policy,
        cuda_graphs=False,
        prefix_caching=True,
    )
    engine = Engine(model, cfg)
    real, _ = replay_on_engine(engine, trace, clock="steps")
    assert engine.block_manager.prefix_cache.hit_tokens > 0, "the shared prefixes should hit"
    for fast in (True, False):
        sim = simulate(
            trace,
            cost=StepCostModel.constant(1000.0),
            scheduler=policy,
            max_num_seqs=6,
            max_num_batched_tokens=budget,
            num_blocks=blocks,
            block_size=8,
            fast_forward=fast,
            prefix_caching=True,
        )
        np.testing.assert_array_equal(sim.records["first_token_s"].to_numpy(), real["first_token_s"].to_numpy())
        np.testing.assert_array_equal(sim.records["finish_s"].to_numpy(), real["finish_s"].to_numpy())
        assert sim.prefix_hit_rate == pytest.approx(engine.block_manager.prefix_cache.hit_rate)
