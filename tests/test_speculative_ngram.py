"""Prompt lookup for a whole batch on the device (``speculative.ngram.propose_ngram``).

Every request's drafts are ``speculative.prompt_lookup.PromptLookupProposer.lookup``'s on its own context, token for
token, over random contexts of ragged lengths from small vocabularies (many matches, many misses), at several γ
and n-gram ranges; a per-request limit cuts its drafts; bad arguments are refused. On a CUDA device (skipped
without one) the search runs with no host synchronisation and gives the CPU's drafts.
"""

import pytest
import torch

from servelab.errors import ParameterError
from servelab.speculative.ngram import propose_ngram
from servelab.speculative.prompt_lookup import PromptLookupProposer
from servelab.speculative.rejection import PLACEHOLDER


def contexts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (batch,), generator=g).tolist()
    out = []
    for n in lengths:
        base = torch.randint(0, vocab, (n,), generator=g).tolist()
        if n > 8 and n % 2:  # half of the longer ones repeat a span of themselves, as answers quote prompts
            base = base[: n // 2] + base[: n - n // 2]
        out.append(base)
    return out


def padded(ctx: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, ctx))
    history = torch.full((len(ctx), width), 12345, dtype=torch.long)  # padding: a token no context holds
    for b, c in enumerate(ctx):
        history[b, : len(c)] = torch.tensor(c)
    return history, torch.tensor([len(c) for c in ctx])


@pytest.mark.parametrize("gamma", [1, 4, 7])
@pytest.mark.parametrize("max_ngram, min_ngram", [(3, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("vocab", [3, 8])
def test_each_requests_drafts_are_prompt_lookups_own(gamma, max_ngram, min_ngram, vocab):
    ctx = contexts(48, vocab, seed=gamma * 100 + max_ngram * 10 + vocab)
    drafts, counts = propose_ngram(*padded(ctx), gamma, max_ngram, min_ngram)
    proposer = PromptLookupProposer(max_ngram, min_ngram)
    for b, c in enumerate(ctx):
        want = proposer.lookup(c, gamma)
        assert counts[b] == len(want)
        assert drafts[b].tolist() == want + [PLACEHOLDER] * (gamma - len(want))
    assert 0 < counts.sum() < 48 * gamma  # both drafts and misses ran


def test_a_limit_cuts_a_requests_drafts():
    ctx = [[1, 2, 1, 2, 1, 2, 1]] * 4  # a repeating pattern drafts to γ
    limits = torch.tensor([0, 1, 3, 9])
    drafts, counts = propose_ngram(*padded(ctx), 5, limits=limits)
    assert counts.tolist() == [0, 1, 3, 5]
    assert drafts[3].tolist() == [2, 1, 2, 1, 2] and drafts[1].tolist() == [2] + [PLACEHOLDER] * 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gamma=0), "gamma must be a positive int"),
        (dict(gamma=2, max_ngram=1, min_ngram=2), "must not exceed"),
        (dict(gamma=2, history=torch.zeros(2, 5)), "LongTensor"),
        (dict(gamma=2, lengths=torch.zeros(3, dtype=torch.long)), "lengths must be \\[2\\]"),
        (dict(gamma=2, limits=torch.zeros(1, dtype=torch.long)), "limits must be \\[2\\]"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = dict(history=torch.zeros(2, 5, dtype=torch.long), lengths=torch.tensor([5, 3])) | kwargs
    with pytest.raises(ParameterError, match=message):
        propose_ngram(**args)


@pytest.mark.gpu
def test_on_the_gpu_drafts_are_found_without_a_host_sync_and_equal_the_cpus():
    history, lengths = padded(contexts(256, 4, seed=9))
    want = propose_ngram(history, lengths, 4)
    cuda = (history.cuda(), lengths.cuda())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any call that waits for the device raises
    try:
        drafts, counts = propose_ngram(*cuda, 4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(drafts.cpu(), want[0]) and torch.equal(counts.cpu(), want[1])
