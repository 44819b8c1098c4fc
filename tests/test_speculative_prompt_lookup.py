"""Prompt lookup and self-drafts in the engine's speculative mode (float32, CPU, the tiny random Llama).

The host proposer (``speculative.prompt_lookup``) drafts token by token (checked against a plain search), may propose
short or nothing. In the engine, greedy output is the target's own, token for token, and the engine keeps exactly the
drafts that Study 3's per-position agreement (``real_acceptance``) counts, for prompt lookup and for a self-draft.
"""

import numpy as np
import pytest
import torch
from test_spec_real import speculative_engine

from servelab.engine import SamplingParams
from servelab.speculative.prompt_lookup import PromptLookupProposer
from servelab.speculative.self_draft import self_draft
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


# ---- in the engine -------------------------------------------------------------------------------------
def run_engine(e, prompts, refs, agreement, gamma):
    """Generate each prompt; check the tokens, and the kept drafts against ``rounds`` of the agreement vector (a step
    drafts at most the tokens left less one, so the last token is a plain step). Returns (kept, rejections)."""
    kept = rejected = 0
    for prompt, ref in zip(prompts, refs, strict=True):
        s = e.spec_stats
        before = (s.num_accepted_tokens, s.num_rejections)
        (tokens,) = e.generate([prompt], SamplingParams(max_tokens=NEW, ignore_eos=True))
        assert tokens == ref
        # the first token is the target's prefill; speculative steps start at the second
        want_kept, want_rejected, _ = ra.rounds(agreement(prompt + ref[:1], ref[1:])[:-1], gamma)
        got = (s.num_accepted_tokens - before[0], s.num_rejections - before[1])
        assert got[0] == want_kept
        # a position with nothing to copy is a miss to the agreement and a plain step to the engine
        assert got[1] <= want_rejected
        kept, rejected = kept + got[0], rejected + got[1]
    assert e.leaked() == []
    return kept, rejected


@pytest.mark.parametrize("gamma", [1, 3])
def test_prompt_lookup_in_the_engine_is_the_targets_greedy_output_with_the_agreements_kept_drafts(case, gamma):
    target, prompts, refs = case
    pl = PromptLookupProposer()
    kept, rejected = run_engine(
        speculative_engine(target, None, gamma), prompts, refs, lambda p, r: ra.lookup_agreement(pl, p, r), gamma
    )
    assert kept > 0 and rejected > 0


def test_self_draft_in_the_engine_is_the_targets_greedy_output_with_the_agreements_counts(case):
    target, prompts, refs = case
    gamma, draft = 3, self_draft(target, 1)
    kept, rejected = run_engine(
        speculative_engine(target, draft, gamma), prompts, refs, lambda p, r: ra.greedy_agreement(draft, p, r), gamma
    )
    assert kept > 0 and rejected > 0
