"""Prompt lookup and self-drafts inside the speculative loop (float32, CPU, the tiny random Llama).

Greedy output is the target's own, token for token; the loop keeps exactly the drafts that Study 3's per-position
agreement (``real_acceptance``) counts, for prompt lookup and for a self-draft. Lookup proposals are drafted token by
token (checked against a plain search), may be short or empty, and roll back the target alone; sampling runs the
rejection rule with a one-hot q and keeps the target's distribution.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from servelab.engine import SamplingParams
from servelab.spec import PagedLM, SpeculativeDecoder
from servelab.spec.acceptance import probabilities
from servelab.spec.decoder import _accept
from servelab.spec.prompt_lookup import PromptLookupProposer
from servelab.spec.proposer import Proposal
from servelab.spec.self_draft import self_draft
from servelab.studies.s03_speculative import real_acceptance as ra

NEW = 24


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module")
def case():
    """The target, prompts that repeat themselves (so that lookup finds matches, right and wrong) and its greedy
    answers to them."""
    from servelab.models import load_model

    target = load_model("config:tiny-llama", seed=0).model
    g = torch.Generator().manual_seed(8)
    prompts = []
    for n, period in ((5, 5), (18, 6), (30, 4)):
        base = torch.randint(3, 512, (period,), generator=g).tolist()
        prompts.append((base * (n // period + 1))[:n] + torch.randint(3, 512, (3,), generator=g).tolist())
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW
            )
            refs.append(out[0, len(p) :].tolist())
    return target, prompts, refs


def plain_next(context, max_ngram, min_ngram):
    """The search written out: the token after the latest earlier occurrence of the longest matching suffix."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == context[len(context) - n :]:
                return context[start + n]
    return None


# ---- the proposer --------------------------------------------------------------------------------------
def test_lookup_drafts_each_token_as_the_first_copy_on_the_context_so_far():
    rng = np.random.default_rng(0)
    seen_short = seen_full = 0
    for trial in range(200):
        pl = PromptLookupProposer(max_ngram=int(rng.integers(1, 4)), min_ngram=1)
        ctx = rng.integers(0, 4 if trial % 2 else 12, int(rng.integers(1, 30))).tolist()
        drafts = pl.lookup(ctx, 5)
        for i in range(len(drafts) + 1):
            want = plain_next(ctx + drafts[:i], pl.max_ngram, pl.min_ngram)
            if i < len(drafts):
                assert drafts[i] == want
            else:
                assert len(drafts) == 5 or want is None  # it stops only where nothing matches
        seen_short += len(drafts) < 5
        seen_full += len(drafts) == 5
    assert seen_short and seen_full
    # a repeating pattern is drafted past the end of the context (a span copy would stop after [5, 6])
    assert PromptLookupProposer(max_ngram=3).lookup([5, 6, 5, 6], 4) == [5, 6, 5, 6]
    assert PromptLookupProposer(max_ngram=3, min_ngram=2).lookup([5, 6, 7, 6], 3) == []


# ---- the loop ------------------------------------------------------------------------------------------
def run_loop(dec, prompts, refs, agreement, gamma):
    """Generate each prompt; check the tokens, and the counts against ``rounds`` of the agreement vector."""
    gens = []
    for prompt, ref in zip(prompts, refs, strict=True):
        gen = dec.generate(prompt, SamplingParams(max_tokens=NEW, ignore_eos=True))
        assert gen.tokens == ref
        # the first token is the target's prefill; rounds start at the second
        hits = agreement(prompt + ref[:1], ref[1:])
        assert (gen.accepted, gen.rejections, len(gen.rounds)) == ra.rounds(hits, gamma)
        assert dec.target.tokens == gen.committed[:-1]  # the target rolled back to the committed prefix
        gens.append(gen)
    return gens


def pooled(prompts, refs, draft, gamma):
    """``real_acceptance``'s row for ``draft`` on the loop's rounds (which start after the prefill's token)."""
    row = ra.real_acceptance(
        {"d": draft},
        [p + r[:1] for p, r in zip(prompts, refs, strict=True)],
        [r[1:] for r in refs],
        target_name="tiny",
        gamma=gamma,
        n_boot=10,
    )
    return row.iloc[0]


@pytest.mark.parametrize("gamma", [1, 3])
def test_prompt_lookup_in_the_loop_is_the_targets_greedy_output_with_the_agreements_counts(case, gamma):
    target, prompts, refs = case
    pl = PromptLookupProposer()
    t = PagedLM.from_hf(target, 96, gamma + 1, name="target", block_size=4)
    dec = SpeculativeDecoder(t, pl, gamma=gamma)
    assert dec.draft is None
    gens = run_loop(dec, prompts, refs, lambda p, r: ra.lookup_agreement(pl, p, r), gamma)
    rounds = [r for g in gens for r in g.rounds]
    assert sum(g.accepted for g in gens) > 0 and sum(g.rejections for g in gens) > 0
    assert any(r.proposed == 0 for r in rounds)  # rounds with nothing to copy ran as plain decode steps
    assert all(r.draft_rows_first == 0 and r.draft_dropped == 0 for r in rounds)
    assert all(r.target_dropped == r.proposed - r.accepted for r in rounds)
    row = pooled(prompts, refs, pl, gamma)
    kept, rejected = sum(g.accepted for g in gens), sum(g.rejections for g in gens)
    assert row.alpha_rounds == kept / (kept + rejected)
    assert row.tokens_per_round == row.positions / sum(len(g.rounds) for g in gens)


def test_self_draft_in_the_loop_is_the_targets_greedy_output_with_the_agreements_counts(case):
    target, prompts, refs = case
    gamma, draft = 3, self_draft(target, 1)
    t = PagedLM.from_hf(target, 96, gamma + 1, name="target", block_size=4)
    d = PagedLM.from_hf(draft, 96, 2, name="self-1L", block_size=4)
    dec = SpeculativeDecoder(t, d, gamma=gamma)
    gens = run_loop(dec, prompts, refs, lambda p, r: ra.greedy_agreement(draft, p, r), gamma)
    kept, rejected = sum(g.accepted for g in gens), sum(g.rejections for g in gens)
    assert kept > 0 and rejected > 0
    assert pooled(prompts, refs, draft, gamma).alpha_rounds == kept / (kept + rejected)


# ---- sampling ------------------------------------------------------------------------------------------
def test_a_one_hot_q_keeps_the_targets_distribution():
    """A lookup draft x and the target's p: the emitted token is x with probability p(x), else drawn from p
    without x, so it is distributed as p."""
    V, x, n = 6, 2, 3000
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(3)) * 2
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(V, dtype=int)
    for _ in range(n):
        acc = _accept(logits, Proposal([x], None), params, gen)
        counts[x if acc.accepted else acc.next_token] += 1
    p = probabilities(logits[:1], 1.0)[0].double().numpy()
    assert stats.chisquare(counts, n * p / p.sum()).pvalue > 1e-3
    assert 0.05 < p[x] < 0.95 and counts[x] < n  # both branches ran


def test_sampling_with_prompt_lookup_runs_and_rolls_back(case):
    target, _, _ = case
    t = PagedLM.from_hf(target, 96, 4, name="target", block_size=4)
    dec = SpeculativeDecoder(t, PromptLookupProposer(), gamma=3)
    # a low temperature: the random target's samples repeat the prompt's pattern often enough to be drafted
    params = SamplingParams(max_tokens=NEW, temperature=0.05, seed=0, ignore_eos=True)
    gen = dec.generate([7, 9, 11, 13] * 6, params)
    assert len(gen.tokens) == NEW and 0 < gen.accepted < gen.proposed  # drafts were both kept and rejected
    assert t.tokens == gen.committed[:-1]
