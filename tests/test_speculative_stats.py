"""vLLM's speculative counters from a step's outcome (``speculative.stats.SpecDecodeStats``): totals, the count per
draft position, the derived acceptance rate and length, requests that proposed nothing, and outcomes that cannot
happen refused."""

import math

import pytest
import torch

from servelab.errors import ParameterError
from servelab.speculative.rejection import verify
from servelab.speculative.stats import SpecDecodeStats


def test_counts_follow_a_steps_outcome():
    stats = SpecDecodeStats(num_spec_tokens=3)
    assert math.isnan(stats.acceptance_rate) and math.isnan(stats.mean_acceptance_length)
    stats.observe(proposed=[3, 3, 2, 0], emitted=[4, 1, 2, 1])  # all kept, none kept, one of two, nothing proposed
    stats.observe(proposed=[1], emitted=[2])
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 9, 5)
    assert stats.per_position == [3, 1, 1]
    assert stats.acceptance_rate == pytest.approx(5 / 9)
    assert stats.mean_acceptance_length == pytest.approx(1 + 5 / 4)


def test_it_counts_what_verify_returns():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 5, 7, generator=g)
    drafts = logits[:, :4].argmax(-1)
    drafts[::3, 1] = (drafts[::3, 1] + 1) % 7  # every third request misses at its second draft
    num = torch.full((32,), 4)
    out = verify(logits, drafts, num, torch.zeros(32), all_greedy=True)
    stats = SpecDecodeStats(num_spec_tokens=4)
    stats.observe(num.tolist(), out.emitted.tolist())
    assert stats.per_position == [32, 21, 21, 21] and stats.num_accepted_tokens == 95


@pytest.mark.parametrize("proposed, emitted", [([2], [4]), ([5], [1]), ([2], [0]), ([1, 1], [1])])
def test_outcomes_that_cannot_happen_are_refused(proposed, emitted):
    with pytest.raises(ParameterError):
        SpecDecodeStats(num_spec_tokens=4).observe(proposed, emitted)
