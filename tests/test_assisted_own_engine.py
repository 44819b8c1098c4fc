"""Study 6's own speculative decoding through the engine's speculative mode (``own_engine``): runs of the sweep's
shape, greedy tokens equal to HF's, a mark after every engine step."""

import math

import numpy as np
import pytest
import torch
from test_assisted import _llama

from servelab.studies.s06_hf_assisted.own_engine import OwnEngineSpeculative
from servelab.studies.s06_hf_assisted.runs import Pair, timed_generate


@pytest.fixture(scope="module")
def models():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster and does not stall on a busy box
    # the target is its own draft too: then every draft is accepted, which a test can count on
    yield {"target": _llama(2, 32, 0), "small": _llama(1, 16, 1)}
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 96, (12,), generator=g).tolist() for _ in range(2)]


def test_the_engine_mode_runner_gives_hf_greedy_tokens_with_and_without_a_draft(models, prompts):
    runner = OwnEngineSpeculative.sized(models, [Pair("small", "target")], len(prompts[0]), 16, gamma=3)
    assert runner.max_model_len == 48 and runner.config.max_num_batched_tokens >= len(prompts[0])
    for prompt in prompts:
        plain = timed_generate(models["target"], prompt, 16, pad_token_id=1)
        spec = runner("small", "target", prompt, 16)
        alone = runner(None, "target", prompt, 16)
        assert spec.tokens == plain.tokens and alone.tokens == plain.tokens
        assert spec.dense and not alone.dense and alone.made == 16
        # a mark after every step: the prefill's first token, then each verify step's 1 to γ + 1 tokens
        assert spec.counts[0] == 1 and spec.counts[-1] == 16
        steps = np.diff(spec.counts)
        assert ((steps >= 1) & (steps <= 4)).all() and (np.diff(spec.ms) >= 0).all()
        # a step with one token left to make drafts nothing (a plain step): it is not a round
        assert len(steps) - 1 <= spec.extra["rounds"] <= len(steps)
        assert spec.extra["proposed"] >= spec.extra["accepted"] >= 0
        # the host time of giving rejected drafts' blocks back, inside the steps: a time, never NaN
        assert math.isfinite(spec.extra["rollback_ms"]) and spec.extra["rollback_ms"] >= 0
    assert list(runner._spec) == [("small", "target")] and list(runner._plain) == ["target"]
    with pytest.raises(ValueError, match="no planned pair"):
        runner(None, "small", prompts[0], 4)


def test_a_draft_the_target_agrees_with_is_accepted_whole(models, prompts):
    """The target as its own draft: every draft token is kept, so each verify step emits γ + 1 tokens (the last
    step fewer, at the length limit) and the stats count every proposal as accepted."""
    runner = OwnEngineSpeculative.sized(models, [Pair("target", "target")], len(prompts[0]), 16, gamma=3)
    spec = runner("target", "target", prompts[0], 16)
    assert spec.extra["accepted"] == spec.extra["proposed"] > 0
    assert (np.diff(spec.counts)[:-1] == 4).all()


def test_the_engine_rows_hold_eos_back_to_the_length_as_hf_does(prompts):
    """HF's timed runs make exactly n tokens with ``min_new_tokens = n``: EOS may not be chosen before the end, so
    the runner-up is. The engine rows run the same rule (``min_tokens = n`` over HF's EOS ids), with and without a
    draft: with EOS set to a token greedy decoding picks early, their tokens are still HF's (an engine that ignored
    EOS emitted it there and went on, and parted from HF's tokens at the first natural end)."""
    from test_assisted import _llama

    target = _llama(2, 32, 0)
    free = timed_generate(target, prompts[0], 16, pad_token_id=1).tokens
    eos = free[3]  # a token greedy decoding picks at the fourth position, made the end of sequence
    target.generation_config.eos_token_id = target.config.eos_token_id = eos
    held = timed_generate(target, prompts[0], 16, pad_token_id=1)
    assert held.made == 16 and eos not in held.tokens
    models = {"target": target, "small": _llama(1, 16, 1)}
    runner = OwnEngineSpeculative.sized(models, [Pair("small", "target")], len(prompts[0]), 16, gamma=3)
    assert runner(None, "target", prompts[0], 16).tokens == held.tokens
    spec = runner("small", "target", prompts[0], 16)
    assert spec.tokens == held.tokens and spec.extra["proposed"] > 0  # it drafted: min_tokens keeps speculation on


def test_alpha_holds_eos_back_where_the_timed_run_did(prompts):
    """The target scored against its own EOS-held output agrees with itself everywhere once α holds EOS back as the
    run did; scored without, each position where it wanted EOS counts as a miss that assisted decoding never has."""
    from test_assisted import _llama

    from servelab.studies.s06_hf_assisted.acceptance import greedy_agreement
    from servelab.studies.s06_hf_assisted.runs import hf_eos_ids

    target = _llama(2, 32, 0)
    eos = timed_generate(target, prompts[0], 16, pad_token_id=1).tokens[3]
    target.generation_config.eos_token_id = target.config.eos_token_id = eos
    held = timed_generate(target, prompts[0], 16, pad_token_id=1).tokens
    assert hf_eos_ids(target) == (eos,)
    assert greedy_agreement(target, prompts[0], held, hf_eos_ids(target)) == 1.0
    assert greedy_agreement(target, prompts[0], held) < 1.0


def test_the_engine_rows_are_timed_on_the_hf_runs_clock(models, prompts, monkeypatch):
    """The methodology times with CUDA events: the engine rows take the HF runs' ``TokenClock`` (events on a GPU,
    the host clock here) and mark it after every step, where they read ``perf_counter`` after a sync before."""
    from servelab.studies.s06_hf_assisted import clock, own_engine

    made = []

    class Recording(clock.TokenClock):
        def __init__(self, cuda):
            super().__init__(cuda)
            made.append(self)

    monkeypatch.setattr(own_engine, "TokenClock", Recording)
    runner = OwnEngineSpeculative.sized(models, [Pair("small", "target")], len(prompts[0]), 16, gamma=3)
    spec = runner("small", "target", prompts[0], 16)
    alone = runner(None, "target", prompts[0], 16)
    assert len(made) == 2 and not any(c.cuda for c in made)  # one clock a run; on this CPU, no events
    counts, ms = made[0].marks()
    assert counts.tolist() == spec.counts.tolist() and ms.tolist() == spec.ms.tolist()
    assert made[1].marks()[0].tolist() == [16] == alone.counts.tolist()
