"""Prompt lookup in the batched speculative loop (float32, CPU, tiny random models).

Its tokens are plain greedy decoding's, at batch 1 and over a ragged batch; every sequence keeps, round by round,
exactly the drafts the sequential loop with the same ``PromptLookupProposer`` keeps (the same proposals, the same
acceptance); a sequence with nothing to copy runs a one-row plain step; the padding of short proposals is never
kept nor counted; the target alone rolls back; a round reads the device once.
"""

import numpy as np
import pytest
import torch

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.spec import PagedLM, SpeculativeDecoder
from servelab.spec.batch_decoder import greedy_decode
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.batch_lookup import BatchLookup
from servelab.spec.controlled import ControlledAcceptance
from servelab.spec.prompt_lookup import PromptLookupProposer
from servelab.spec.syncs import HostSyncs

N = 20
BUCKETS = list(range(1, 25))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


def repeating_prompts(seed: int, shapes) -> list[list[int]]:
    """Prompts of a repeated random n-gram (length, period) and 3 random tokens: lookup finds matches, right and
    wrong (a random target's greedy answer falls into loops of its own too)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, period in shapes:
        base = torch.randint(3, 512, (period,), generator=g).tolist()
        out.append((base * (n // period + 1))[:n] + torch.randint(3, 512, (3,), generator=g).tolist())
    return out


@pytest.fixture(scope="module")
def case():
    hf = load_model("config:tiny-llama", seed=0).model
    prompts = repeating_prompts(8, ((5, 5), (18, 6), (30, 4), (11, 3)))  # ragged: 8 to 33 tokens
    t = PagedBatch.from_hf(hf, 96, 4, BUCKETS, name="target", block_size=4)
    ref = greedy_decode(t, prompts, N)
    return hf, t, prompts, ref


def per_sequence(spec, prompts, n):
    """Run the loop round by round; each sequence's (accepted, proposed, asked) per round, the read counts, and
    whether the target's cache held each sequence's committed tokens but the pending one after every round."""
    state = spec.start(prompts, n)
    seqs = [[] for _ in prompts]
    reads, cached = [], True
    while state.active:
        act = list(state.active)
        with HostSyncs("cpu") as s:
            rnd = spec.round(state)
        reads.append(s.count)
        for idx, i in enumerate(act):
            seqs[i].append((rnd.accepted[idx], rnd.proposals[idx], rnd.asked[idx]))
            cached &= spec.target.lengths[i] == len(state.context(i)) - 1
    return spec.finish(state), seqs, reads, cached


def sequential(hf, prompt, gamma, lookup):
    """The sequential loop's (accepted, proposed, γ asked) per round, and its tokens after the prefill's."""
    t = PagedLM.from_hf(hf, 96, gamma + 1, name="sequential", block_size=4)
    gen = SpeculativeDecoder(t, lookup, gamma=gamma).generate(prompt, SamplingParams(max_tokens=N + 1, ignore_eos=True))
    return [(r.accepted, r.proposed, r.gamma) for r in gen.rounds], gen.tokens[1:]


@pytest.mark.parametrize("gamma", [1, 3])
def test_batched_lookup_is_greedy_decoding_and_keeps_the_sequential_loops_drafts(case, gamma):
    hf, t, prompts, ref = case
    lookup = PromptLookupProposer()
    gen, seqs, reads, cached = per_sequence(BatchLookup(t, lookup, gamma), prompts, N)
    assert gen.tokens == ref.tokens and gen.first == ref.first
    for p, rounds, toks in zip(prompts, seqs, ref.tokens, strict=True):
        want, alone = sequential(hf, p, gamma, lookup)
        assert alone == toks
        assert rounds == want  # the same proposals (count) and the same kept drafts, round by round
    assert reads == [1] * len(reads) and len(reads) >= 3  # the round's one read, and no other
    assert cached  # the target alone rolled back, to the committed tokens but the pending one
    # the case is one where lookup works, and fails: drafts were kept and rejected, some rounds had nothing
    assert 0 < gen.accepted < gen.proposed and gen.rejections > 0
    assert any(p == 0 for r in gen.rounds for p in r.proposals)
    assert min(len(s) for s in seqs) < N  # kept drafts shortened a sequence's run
    assert gen.proposed == sum(p for s in seqs for _, p, _ in s)  # −1 padding is never a proposal
    assert gen.draft_steps == 0 and gen.draft_ms == 0 and gen.propose_ms > 0
    assert all(r.agreed == r.active for r in gen.rounds)


def test_batch_one_is_greedy_decoding(case):
    hf, t, prompts, ref = case
    gen = BatchLookup(t, PromptLookupProposer(max_ngram=2), 4).generate(prompts[2:3], N)
    assert gen.tokens == ref.tokens[2:3] and gen.accepted > 0
    # short proposals (the search ran out before γ) are neither kept nor counted beyond their length
    assert all(k <= p <= a for r in gen.rounds for k, p, a in zip(r.accepted, r.proposals, r.asked, strict=True))
    assert any(p < r.gamma for r in gen.rounds for p in r.proposals)


def test_a_gpt2_target_too():
    hf = load_model("config:tiny-gpt2", seed=0).model
    prompts = repeating_prompts(3, ((7, 7), (21, 5), (12, 4)))
    t = PagedBatch.from_hf(hf, 64, 3, BUCKETS, name="gpt2", block_size=4)
    ref = greedy_decode(t, prompts, 12)
    gen = BatchLookup(t, PromptLookupProposer(), 3).generate(prompts, 12)
    assert gen.tokens == ref.tokens and gen.first == ref.first


def test_bad_input_is_refused(case):
    _, t, prompts, ref = case
    lookup = PromptLookupProposer()
    for gamma in (0, -1, True, 2.0):
        with pytest.raises(ParameterError, match="gamma"):
            BatchLookup(t, lookup, gamma)
    with pytest.raises(ParameterError, match="min_ngram"):
        PromptLookupProposer(max_ngram=1, min_ngram=2)
    with pytest.raises(ParameterError, match="PromptLookupProposer"):
        BatchLookup(t, t, 2)
    with pytest.raises(ParameterError, match="controlled"):
        BatchLookup(t, lookup, 2).generate(prompts, 4, ControlledAcceptance(ref.tokens, 0.5, t.vocab))
    with pytest.raises(ParameterError):
        BatchLookup(t, lookup, 2).generate([], 4)
    with pytest.raises(ParameterError):
        BatchLookup(t, lookup, 2).generate(prompts, 0)


# ---- Study 3's timing of it ----------------------------------------------------------------------------
def test_the_study_times_lookup_beside_plain_decoding_at_each_batch(case):
    from servelab.studies.s03_speculative.lookup_speed import batch_prompts, lookup_sweep
    from servelab.studies.s03_speculative.tables import lookup_table

    _, t, prompts, _ = case
    prompts = [prompts[2], prompts[0], prompts[1]]  # batch 1: the prompt whose answer lookup drafts
    raw = lookup_sweep(t, prompts, batches=(1, 4), gammas=(2, 3), max_new_tokens=10, repeats=2)
    assert len(raw) == 2 * 2 * (1 + 2)  # batches × repeats × (plain + each γ)
    table = lookup_table(raw)
    assert [(r.batch, r.gamma) for r in table.itertuples()] == [(1, 2), (1, 3), (4, 2), (4, 3)]
    assert (table.same_tokens == 1).all() and (table.repeats == 2).all() and (table.host_syncs_per_round == 1).all()
    for r in table.itertuples():
        lk = raw[(raw.method == "lookup") & (raw.batch == r.batch) & (raw.gamma == r.gamma)]
        pl = raw[(raw.method == "plain") & (raw.batch == r.batch)]
        plain_tps = np.median(pl.tokens / pl.seconds)
        assert r.tokens_per_s_plain == pytest.approx(plain_tps)
        assert r.speedup == pytest.approx(np.median(lk.tokens / lk.seconds / plain_tps))
        assert r.speedup_low <= r.speedup <= r.speedup_high
        assert r.alpha_realised == lk.accepted.sum() / (lk.accepted.sum() + lk.rejections.sum())
        assert 0 < r.proposed_share <= 1 and r.tokens_per_round >= 1
    assert (raw.tokens == 10 * raw.batch).all()
    assert batch_prompts(prompts, 4) == prompts + prompts[:1]
    with pytest.raises(ParameterError):
        lookup_sweep(t, prompts, repeats=0)
