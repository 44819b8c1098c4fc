"""The acceptance rules: greedy keeps the longest matching prefix; the Leviathan/Chen rejection rule leaves every
emitted token distributed as the target's own sample (chi-square tests on a tiny vocabulary, fixed seeds)."""

import numpy as np
import pytest
import torch
from scipy import stats

from servelab.spec.acceptance import greedy_accept, probabilities, rejection_accept

V, GAMMA, N = 5, 2, 4000


def _dists(seed):
    g = torch.Generator().manual_seed(seed)
    # Dirichlet(1) rows through a seeded generator: normalised exponentials
    p = torch.empty(GAMMA + 1, V).exponential_(generator=g)
    q = torch.empty(GAMMA, V).exponential_(generator=g)
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def _expected(n, dist):
    d = dist.double().numpy()
    return n * d / d.sum()


@pytest.fixture(scope="module")
def sampled():
    """N rounds of γ drafts from q judged against p: the first emitted token of each, and whether x_1 was kept."""
    p, q = _dists(0)
    g = torch.Generator().manual_seed(1)
    first, kept_first, kept = np.zeros(V, dtype=int), 0, 0
    for _ in range(N):
        x = torch.multinomial(q, 1, generator=g)[:, 0]
        acc = rejection_accept(p, q, x, g)
        first[int(x[0]) if acc.accepted >= 1 else acc.next_token] += 1
        kept_first += acc.accepted >= 1
        kept += acc.accepted
    return p, q, first, kept_first, kept


def test_rejection_sampling_gives_the_targets_distribution(sampled):
    p, q, first, _, kept = sampled
    assert stats.chisquare(first, _expected(N, p[0])).pvalue > 1e-3
    # the test has power: the draft's own distribution is clearly rejected by the same counts
    assert stats.chisquare(first, _expected(N, q[0])).pvalue < 1e-6
    assert 0 < kept < N * GAMMA  # some drafts kept, some rejected


def test_acceptance_probability_is_the_overlap_of_p_and_q(sampled):
    """P(keep x_1) = Σ min(p, q): the α of Leviathan et al. for this position."""
    p, q, _, kept_first, _ = sampled
    alpha = float(torch.minimum(p[0], q[0]).sum())
    assert stats.binomtest(kept_first, N, alpha).pvalue > 1e-3


def test_a_draft_equal_to_the_target_is_always_accepted_and_the_bonus_comes_from_p():
    p, _ = _dists(4)
    q = p[:GAMMA].clone()
    g = torch.Generator().manual_seed(5)
    bonus = np.zeros(V, dtype=int)
    n = 1500
    for _ in range(n):
        x = torch.multinomial(q, 1, generator=g)[:, 0]
        acc = rejection_accept(p, q, x, g)
        assert acc.accepted == GAMMA
        bonus[acc.next_token] += 1
    assert stats.chisquare(bonus, _expected(n, p[GAMMA])).pvalue > 1e-3


def test_greedy_keeps_the_longest_matching_prefix_and_adds_the_targets_argmax():
    logits = torch.full((4, 6), -5.0)
    best = [2, 4, 1, 3]
    for i, b in enumerate(best):
        logits[i, b] = 5.0
    assert greedy_accept(logits, torch.tensor([2, 4, 1])) == (3, 3)  # all kept: the bonus
    assert greedy_accept(logits, torch.tensor([2, 0, 1])) == (1, 4)  # the correction at the first mismatch
    assert greedy_accept(logits, torch.tensor([0, 4, 1])) == (0, 2)  # a later match does not count


def test_bad_shapes_are_refused():
    p, q = _dists(6)
    with pytest.raises(ValueError, match="gamma \\+ 1"):
        rejection_accept(p[:GAMMA], q, torch.zeros(GAMMA, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_accept(p, q[:1], torch.zeros(GAMMA, dtype=torch.long))
    with pytest.raises(ValueError, match="gamma \\+ 1"):
        greedy_accept(torch.zeros(2, V), torch.zeros(GAMMA, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        probabilities(torch.zeros(1, V), 0.0)


def test_top_p_restricts_the_distribution():
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]])
    pr = probabilities(logits, 1.0, top_p=0.7)
    assert pr[0, 2:].sum() == 0 and torch.isclose(pr.sum(), torch.tensor(1.0))
