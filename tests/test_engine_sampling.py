"""Sampling: greedy, temperature, top-p, per-request seeds."""

import torch

from servelab.engine.sampling import sample, top_p_filter
from servelab.engine.sequence import SamplingParams


def test_greedy_rows_are_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    got = sample(logits, [SamplingParams()] * 5, [None] * 5)
    assert got.tolist() == logits.argmax(-1).tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = top_p_filter(probs, torch.tensor([0.7]))
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    only_top = top_p_filter(probs, torch.tensor([0.1]))
    assert only_top.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_sampled_tokens_stay_inside_the_top_p_set():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, -2.0]]).repeat(200, 1)
    params = [SamplingParams(temperature=1.0, top_p=0.8)] * 200
    got = sample(logits, params, [None] * 200)
    assert set(got.tolist()) <= {0, 1} and len(set(got.tolist())) == 2


def test_temperature_flattens_the_distribution():
    logits = torch.tensor([[2.0, 0.0]]).repeat(4000, 1)
    g = [torch.Generator().manual_seed(i) for i in range(4000)]
    cold = sample(logits, [SamplingParams(temperature=0.5)] * 4000, g).float().mean()
    g = [torch.Generator().manual_seed(i) for i in range(4000)]
    hot = sample(logits, [SamplingParams(temperature=4.0)] * 4000, g).float().mean()
    # P(token 1) = sigmoid(-2/T): 0.018 at T=0.5, 0.38 at T=4
    assert abs(cold - 0.018) < 0.01 and abs(hot - 0.378) < 0.04


def test_a_seeded_row_does_not_depend_on_its_neighbours():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 100, generator=g)
    p = SamplingParams(temperature=1.0, seed=5)
    alone = sample(logits[1:2], [p], [torch.Generator().manual_seed(5)])
    together = sample(
        logits, [SamplingParams(temperature=1.0), p, SamplingParams()], [None, torch.Generator().manual_seed(5), None]
    )
    assert together[1] == alone[0] and together[2] == logits[2].argmax()


def test_row_count_mismatch_is_an_error():
    import pytest

    with pytest.raises(ValueError, match="one SamplingParams"):
        sample(torch.zeros(2, 4), [SamplingParams()], [None, None])


def test_uniform_batch_fast_path_draws_from_the_softmax():
    logits = torch.tensor([[1.0, 0.0, -1.0]]).repeat(20000, 1)
    torch.manual_seed(0)
    got = sample(logits, [SamplingParams(temperature=1.0)] * 20000, [None] * 20000)
    freq = torch.bincount(got, minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.015, rtol=0)


# ---- issue 20: one request's settings never fail the batch --------------------------------------------------
def _batch_with(first: SamplingParams, first_generator=None):
    """Row 0 carries ``first``; rows 1-3 sample at temperature 1 with top-p (the multinomial path)."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = [first] + [SamplingParams(temperature=1.0, top_p=0.9)] * 3
    return logits, sample(logits, params, [first_generator, None, None, None])


def test_a_top_p_that_underflows_keeps_the_top_token():
    logits, got = _batch_with(SamplingParams(temperature=1.0, top_p=1e-300))
    assert got[0] == logits[0].argmax()


def test_a_tiny_temperature_with_top_p_is_greedy():
    logits, got = _batch_with(SamplingParams(temperature=1e-40, top_p=0.9))
    assert got[0] == logits[0].argmax()


def test_a_tiny_temperature_with_a_seed_is_greedy():
    logits, got = _batch_with(SamplingParams(temperature=1e-300, seed=3), torch.Generator().manual_seed(3))
    assert got[0] == logits[0].argmax()


def test_a_lone_tiny_temperature_is_greedy_not_token_zero():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    assert logits.argmax(-1).tolist() != [0, 0, 0, 0]
    got = sample(logits, [SamplingParams(temperature=1e-300)] * 4, [None] * 4)
    assert got.tolist() == logits.argmax(-1).tolist()
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-5).greedy


def test_a_row_of_nan_logits_does_not_fail_its_neighbours():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]]).repeat(50, 1)
    logits[0] = float("nan")
    logits[1, 2] = float("nan")  # NaN counted as -inf: the row's argmax stays token 0
    got = sample(logits, [SamplingParams(temperature=1.0, top_p=0.8)] * 50, [None] * 50)
    assert got[0] == 0 and got[1] == 0 and set(got[2:].tolist()) <= {0, 1}
