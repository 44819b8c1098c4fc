"""Drafts for a real target, and its acceptance, on tiny random models (float32, CPU).

The teacher-forced agreement vector must predict the speculative loop's own counts exactly (the loop is run beside
it); prompt lookup, the self-draft, batched continuations and the distillation step are each checked against what
they stand for.
"""

import copy

import numpy as np
import pytest
import torch

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.speculative.prompt_lookup import PromptLookupProposer
from servelab.speculative.self_draft import self_draft
from servelab.studies.common.drafts import distill
from servelab.studies.common.drafts.generate import continuations
from servelab.studies.common.drafts.prompts import HELDOUT_TOPICS, TRAIN_TOPICS, chat_prompts
from servelab.studies.s03_speculative import real_acceptance as ra

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module")
def target():
    return load_model("config:tiny-llama", seed=0).model


def noisy_copy(model, scale: float, seed: int = 3):
    """The target with noise on its layers: a draft that agrees often, not always."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.model.layers.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std())
    return d


def greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


# ---- prompt lookup -------------------------------------------------------------------------------------
def test_prompt_lookup_copies_after_the_latest_longest_match():
    pl = PromptLookupProposer(max_ngram=2)
    # suffix [1, 2] occurs at 0 (then 7) and at 4 (then 9): the latest wins
    assert pl.lookup([1, 2, 7, 5, 1, 2, 9, 8, 1, 2], 3) == [9, 8, 1]
    # no 2-gram match: falls back to the 1-gram [4], latest at index 1
    assert pl.lookup([3, 4, 6, 4, 5, 9, 4], 2) == [5, 9]
    assert pl.lookup([1, 2, 3], 4) == []


def test_prompt_lookup_refuses_bad_settings():
    for kw in (dict(max_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=True)):
        with pytest.raises(ParameterError):
            PromptLookupProposer(**kw)
    with pytest.raises(ParameterError, match="gamma"):
        PromptLookupProposer().lookup([1, 1], 0)


# ---- self-draft ----------------------------------------------------------------------------------------
def test_self_draft_shares_the_targets_weights_and_runs_its_first_layers(target):
    d = self_draft(target, 1)
    assert (
        d.model.layers[0].self_attn.q_proj.weight.data_ptr()
        == target.model.layers[0].self_attn.q_proj.weight.data_ptr()
    )
    assert d.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert sum(p.numel() for p in d.parameters()) < sum(p.numel() for p in target.parameters())
    # reference: the target's forward with its hidden state after layer 1 sent through its final norm and head
    ids = torch.randint(3, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        hidden = target(ids, output_hidden_states=True).hidden_states[1]
        ref = target.lm_head(target.model.norm(hidden))
        torch.testing.assert_close(d(ids).logits, ref)


def test_self_draft_refuses_all_or_no_layers(target):
    for k in (0, 2, 1.5):
        with pytest.raises(ParameterError):
            self_draft(target, k)


# ---- agreement and rounds ------------------------------------------------------------------------------
def test_rounds_follow_the_leading_runs_of_hits():
    h = np.array([1, 1, 0, 1, 1, 1, 1, 0, 0], dtype=bool)
    # γ=2: [1,1]+bonus(0) | [1,1]+bonus(1)... positions: t0 keeps 2 (γ), emits 3 -> t=3; keeps 2 -> t=6;
    # keeps 1 (hit at 6, miss at 7) -> t=8; keeps 0 at 8 (miss) -> t=9
    assert ra.rounds(h, 2) == (5, 2, 4)
    assert ra.rounds(np.ones(5, dtype=bool), 4) == (4, 0, 1)  # 4 kept + bonus ends the answer
    assert ra.rounds(np.zeros(3, dtype=bool), 3) == (0, 3, 3)
    with pytest.raises(ParameterError):
        ra.rounds(h, 0)


def speculative_engine(target, draft, gamma: int):
    """The engine's speculative mode over HF ``target`` with ``draft`` (an HF model) or, for None, prompt lookup."""
    from servelab.engine import EngineConfig
    from servelab.engine.speculative_engine import SpeculativeEngine
    from servelab.models.native import native_from_hf
    from servelab.speculative.config import SpeculativeConfig

    cfg = EngineConfig(block_size=4, num_blocks=64, max_model_len=96)
    if draft is None:
        return SpeculativeEngine.from_hf(target, cfg, speculative=SpeculativeConfig("ngram", gamma))
    spec = SpeculativeConfig("draft_model", gamma, model="(given)")
    return SpeculativeEngine.from_hf(target, cfg, speculative=spec, draft=native_from_hf(draft, max_positions=96))


@pytest.mark.parametrize("gamma", [1, 3])
def test_agreement_predicts_the_speculative_modes_counts(target, gamma):
    """The same draft in the engine's speculative mode keeps exactly the drafts the agreement vector says."""
    draft = noisy_copy(target, 0.6)
    e = speculative_engine(target, draft, gamma)
    g = torch.Generator().manual_seed(5)
    seen = 0
    for n in (6, 17):
        prompt = torch.randint(3, 512, (n,), generator=g).tolist()
        s = e.spec_stats
        before = (s.num_accepted_tokens, s.num_rejections, s.num_drafts)
        (tokens,) = e.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))
        ref = greedy(target, prompt, 24)
        assert tokens == ref
        # the first token is the target's prefill; speculative steps start at the second. A step drafts at most the
        # tokens the request may still make less one (its own token), so the last token is a plain step
        hits = ra.greedy_agreement(draft, prompt + ref[:1], ref[1:])
        kept, rejected, count = ra.rounds(hits[:-1], gamma)
        got = (s.num_accepted_tokens - before[0], s.num_rejections - before[1], s.num_drafts - before[2])
        assert got == (kept, rejected, count)
        seen += got[0]
    assert seen > 0  # the noisy draft agrees sometimes, so the comparison is not all zeros


def test_lookup_agreement_scores_the_first_copied_token():
    ref = [5, 6, 5, 6, 7]
    hits = ra.lookup_agreement(PromptLookupProposer(max_ngram=1), [5, 6], ref)
    # [5,6]: no earlier 6, no proposal; then 5→6, 6→5, 5→6 copied and right; last, 6→5 copied but 7 came
    assert hits.tolist() == [False, True, True, True, False]


def test_bootstrap_interval_holds_the_estimate_and_narrows_with_prompts():
    rng = np.random.default_rng(0)
    few = [rng.random(20) < 0.6 for _ in range(8)]
    many = [rng.random(20) < 0.6 for _ in range(128)]
    for hits in (few, many):
        lo, hi = ra.bootstrap_ci(hits, seed=1)
        est = sum(h.sum() for h in hits) / sum(len(h) for h in hits)
        assert lo <= est <= hi
    assert np.subtract(*ra.bootstrap_ci(many)[::-1]) < np.subtract(*ra.bootstrap_ci(few)[::-1])
    same = [np.array([1, 0, 1, 1], dtype=bool)] * 5
    assert ra.bootstrap_ci(same) == (0.75, 0.75)


def test_real_acceptance_scores_the_target_as_one_and_a_noisy_draft_in_between(target):
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (4, 9, 13)]
    refs = [greedy(target, p, 12) for p in prompts]
    df = ra.real_acceptance(
        {"self": target, "noisy": noisy_copy(target, 0.6), "lookup": PromptLookupProposer()},
        prompts,
        refs,
        target_name="tiny",
        kinds={"self": "check", "lookup": "lookup"},
        gamma=3,
    )
    assert list(df.columns[:5]) == ["pair", "alpha", "ci_low", "ci_high", "prompts"]
    row = df.set_index("draft")
    # 11 of each answer's 12 positions count (the first is the prefill's): the target's rounds keep 3 drafts and
    # add its token, 4 + 4 + 3 tokens over 3 rounds
    assert row.at["self", "alpha"] == 1.0 and row.at["self", "tokens_per_round"] == pytest.approx(11 / 3)
    assert 0 < row.at["noisy", "alpha"] < 1
    assert (df["prompts"] == 3).all() and (df["positions"] == 33).all()
    assert row.at["lookup", "kind"] == "lookup" and row.at["noisy", "kind"] == "draft"
    with pytest.raises(ParameterError):
        ra.real_acceptance({"x": target}, prompts, refs[:1], target_name="tiny")


# ---- data and distillation -----------------------------------------------------------------------------
def test_chat_prompts_keep_heldout_topics_apart():
    assert not set(TRAIN_TOPICS) & set(HELDOUT_TOPICS)
    held = chat_prompts("heldout")
    assert len(held) >= 32 and chat_prompts("heldout", 5) == held[:5]
    assert not any(t in p for p in chat_prompts("train") for t in HELDOUT_TOPICS)
    for bad in (dict(split="test"), dict(split="train", n=0), dict(split="heldout", n=10_000)):
        with pytest.raises(ParameterError):
            chat_prompts(**bad)


def test_repeats_seeds_take_disjoint_slices_of_the_heldout_prompts():
    """Repeat r runs with seed default + r: seeds 0, 1, 2 asking for 48 held-out prompts get 144 different ones (a
    shuffle per seed gave 98), so an α pooled over the repeats counts no prompt twice; seed 0 is the order as it was;
    past the end a slice wraps round."""
    held = chat_prompts("heldout")
    slices = [chat_prompts("heldout", 48, seed=r) for r in range(3)]
    assert slices[0] == held[:48] and len({p for s in slices for p in s}) == 144
    assert chat_prompts("heldout", 48, seed=3) == held[144:] + held[:32]
    with pytest.raises(ParameterError):
        chat_prompts("heldout", 4, seed=-1)
    import numpy as np

    assert chat_prompts("heldout", 48, seed=np.int64(1)) == slices[1]  # a seed read from a table is numpy's


def test_the_drafts_cache_is_keyed_by_the_prompts_texts_and_the_generation_batch(monkeypatch):
    """A change of topics (or templates) gives other generations, so another cache entry; so does the batch."""
    from dataclasses import replace

    from servelab.studies.common.drafts import prompts
    from servelab.studies.common.drafts.distill import RECIPES

    recipe = RECIPES["smoke"]
    key = recipe.gen_key("config:tiny-llama")
    assert replace(recipe, gen_batch=recipe.gen_batch + 1).gen_key("config:tiny-llama") != key
    monkeypatch.setattr(prompts, "TRAIN_TOPICS", tuple(reversed(prompts.TRAIN_TOPICS)))
    assert recipe.gen_key("config:tiny-llama")["texts"] != key["texts"]


def test_batched_continuations_equal_one_prompt_greedy_and_stop_after_eos(target):
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (3, 11, 7)]
    refs = [greedy(target, p, 10) for p in prompts]
    got = continuations(target, prompts, 10, eos_ids=[511], pad_id=0, batch_size=2)
    assert got == refs or all(r == g_[: len(r)] for r, g_ in zip(refs, got, strict=True))
    stop = refs[1][4]
    cut = continuations(target, prompts[1:2], 10, eos_ids=[stop], pad_id=0)
    assert cut[0] == refs[1][: refs[1].index(stop) + 1]


def test_a_distilled_draft_starts_as_the_self_draft_and_learns_the_targets_tokens(target):
    draft = distill.init_draft(target, 1)
    ids = torch.randint(3, 512, (1, 8), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        torch.testing.assert_close(draft(ids).logits, self_draft(target, 1)(ids).logits)
    assert not draft.model.embed_tokens.weight.requires_grad
    g = torch.Generator().manual_seed(8)
    data = []
    for n in (5, 6, 7, 8):
        p = torch.randint(3, 512, (n,), generator=g).tolist()
        data.append(dict(prompt=p, answer=greedy(target, p, 12)))
    recipe = distill.DistillRecipe("test", (1,), 4, 12, 0, 0.8, 4, 3.0, 4, 3e-3, 2)
    trained, curve, seconds = distill.train_draft(target, 1, data, recipe)
    assert seconds >= 3.0 and len(curve) >= 5
    assert np.mean([r["loss"] for r in curve[-3:]]) < 0.8 * np.mean([r["loss"] for r in curve[:3]])
    before = ra.real_acceptance({"d": draft}, [r["prompt"] for r in data], [r["answer"] for r in data], target_name="t")
    after = ra.real_acceptance(
        {"d": trained}, [r["prompt"] for r in data], [r["answer"] for r in data], target_name="t"
    )
    assert after["alpha"].iloc[0] > before["alpha"].iloc[0]
    assert torch.equal(trained.model.embed_tokens.weight, target.model.embed_tokens.weight)


def test_lr_warms_up_then_decays_over_the_budget():
    assert distill.lr_at(0, 10, 0, 1.0, 4) == 0.25
    assert distill.lr_at(0, 10, 4, 1.0, 4) == pytest.approx(1.0)
    assert distill.lr_at(10, 10, 50, 1.0, 4) == pytest.approx(0.1)
