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
