"""Speculative decoding on the engine's model code (float32, CPU, tiny random models).

Greedy speculative output is token-identical to the target's own greedy output (HF ``generate``), whatever the
draft: a random draft only lowers α. A draft identical to the target is always accepted. Sampling from a tiny
vocabulary gives the target's distribution of the first speculative token (chi-square).
"""

import numpy as np
import pytest
import torch
from scipy import stats

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.spec import PagedLM, SpeculativeDecoder, autoregressive
from servelab.studies.s03_speculative.pair import SpeculativePair

STEPS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def pair(request):
    target = load_model(f"config:{request.param}", seed=0).model
    draft = load_model(f"config:{request.param}", seed=7).model  # random: mostly wrong, never harmful
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=g).tolist() for n in (5, 23)]
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                pad_token_id=0,
            )
            refs.append(out[0, len(p) :].tolist())
    t = PagedLM.from_hf(target, 128, 9, name="target", block_size=4)
    d = PagedLM.from_hf(draft, 128, 2, name="draft", block_size=4)
    return target, t, d, prompts, refs


GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)


@pytest.mark.parametrize("gamma", [1, 4, "adaptive"])
def test_greedy_speculation_equals_the_targets_own_greedy_output(pair, gamma):
    _, t, d, prompts, refs = pair
    dec = SpeculativeDecoder(t, d, gamma=gamma)
    for p, ref in zip(prompts, refs, strict=True):
        gen = dec.generate(p, GREEDY)
        assert gen.tokens == ref
        assert gen.finish_reason == "length"
        assert sum(r.emitted for r in gen.rounds) == STEPS - 1  # the first token is the target's prefill
        assert all(r.accepted <= r.gamma for r in gen.rounds)


def test_autoregressive_baseline_is_the_targets_greedy_output(pair):
    _, t, _, prompts, refs = pair
    assert [autoregressive(t, p, GREEDY).tokens for p in prompts] == refs


def test_a_draft_equal_to_the_target_is_always_accepted(pair):
    hf, t, _, prompts, refs = pair
    twin = PagedLM.from_hf(hf, 128, 2, name="twin", block_size=4)
    dec = SpeculativeDecoder(t, twin, gamma=4)
    gen = dec.generate(prompts[1], GREEDY)
    assert gen.tokens == refs[1]
    assert gen.accepted == gen.proposed and gen.rejections == 0
    assert max(r.emitted for r in gen.rounds) == 5  # γ kept + the bonus token
    sampled = dec.generate(prompts[0], SamplingParams(max_tokens=STEPS, temperature=1.0, seed=3, ignore_eos=True))
    assert sampled.accepted == sampled.proposed  # p = q: min(1, p/q) = 1 for every token


def test_adaptive_gamma_grows_with_a_perfect_draft(pair):
    hf, t, _, prompts, _ = pair
    twin = PagedLM.from_hf(hf, 128, 2, name="twin", block_size=4)
    gen = SpeculativeDecoder(t, twin, gamma="adaptive").generate(
        prompts[0], SamplingParams(max_tokens=48, ignore_eos=True)
    )
    gammas = [r.gamma for r in gen.rounds]
    assert gammas[:6] == [4, 5, 6, 7, 8, 8]  # one more per fully accepted round, up to the maximum


def test_stop_tokens_and_max_tokens_end_generation(pair):
    _, t, d, prompts, refs = pair
    stop = refs[0][5]
    gen = SpeculativeDecoder(t, d, gamma=3).generate(
        prompts[0], SamplingParams(max_tokens=STEPS, stop_token_ids=(stop,), ignore_eos=True)
    )
    assert gen.tokens == refs[0][: refs[0].index(stop) + 1] and gen.finish_reason == "stop"
    assert (
        SpeculativeDecoder(t, d, gamma=8).generate(prompts[0], SamplingParams(max_tokens=3, ignore_eos=True)).tokens
        == refs[0][:3]
    )


def test_bad_input_is_refused(pair):
    _, t, d, prompts, _ = pair
    with pytest.raises(ParameterError, match="gamma up to 9"):
        SpeculativeDecoder(t, d, gamma=9)  # the target captures at most 9 rows
    with pytest.raises(ParameterError, match="max_model_len"):
        SpeculativeDecoder(t, d, gamma=2).generate(prompts[0], SamplingParams(max_tokens=200))
    with pytest.raises(ParameterError, match="at least one token"):
        SpeculativeDecoder(t, d, gamma=2).generate([], GREEDY)
    with pytest.raises(ParameterError, match="token ids"):
        t.reset()
        t.forward([10**6])
    with pytest.raises(ParameterError, match="gamma"):
        SpeculativeDecoder(t, d, gamma=0)


def test_vocabularies_must_match():
    a = PagedLM.from_hf(load_model("config:tiny-llama").model, 64, 3)
    b = PagedLM.from_hf(_tiny_vocab_model(0), 16, 2)
    with pytest.raises(ParameterError, match="vocabularies differ"):
        SpeculativeDecoder(a, b, gamma=2)


def test_pair_entry_point(pair):
    hf, _, _, prompts, refs = pair
    draft = load_model("config:tiny-llama" if hf.config.model_type == "llama" else "config:tiny-gpt2", seed=5).model
    sp = SpeculativePair.from_hf(hf, draft, max_model_len=96, gamma=2)
    assert sp.generate(prompts[0], GREEDY).tokens == refs[0]
    assert sp.autoregressive(prompts[0], GREEDY).tokens == refs[0]


def _tiny_vocab_model(seed, vocab=4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the random logits so that target and draft disagree clearly
        m.lm_head.weight.mul_(15)
    return m


def test_speculative_sampling_keeps_the_targets_distribution():
    """The second generated token (the first a speculative round produces) against the target's exact
    distribution Σ_t1 p(t1) p(t2 | t1), computed from its logits."""
    target, draft = _tiny_vocab_model(0), _tiny_vocab_model(1)
    V, prompt, n = 4, [2, 3, 1], 500
    with torch.inference_mode():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1)
        p2 = torch.stack(
            [torch.softmax(target(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1) for a in range(V)]
        )
        q2 = torch.stack(
            [torch.softmax(draft(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1) for a in range(V)]
        )
    expected = (p1[:, None] * p2).sum(0).numpy()
    assert expected.min() * n > 5  # chi-square needs every cell populated
    t = PagedLM.from_hf(target, 16, 3, block_size=4)
    d = PagedLM.from_hf(draft, 16, 2, block_size=4)
    dec = SpeculativeDecoder(t, d, gamma=2, eos_token_ids=())
    counts, accepted, proposed = np.zeros(V, dtype=int), 0, 0
    for i in range(n):
        gen = dec.generate(prompt, SamplingParams(max_tokens=2, temperature=1.0, seed=i))
        counts[gen.tokens[1]] += 1
        accepted, proposed = accepted + gen.accepted, proposed + gen.proposed
    assert stats.chisquare(counts, n * expected / expected.sum()).pvalue > 1e-3
    draft_marginal = (p1[:, None] * q2).sum(0).numpy()
    assert stats.chisquare(counts, n * draft_marginal / draft_marginal.sum()).pvalue < 1e-6  # power
    assert 0 < accepted < proposed


class EagerGraphs:
    """The engine's ``DecodeGraphs`` with every bucket run eagerly: on the CPU this exercises the graph path's packed
    inputs (padding rows into the scratch block, table rows gathered inside the step) that a GPU replays."""

    def __new__(cls, lm, batch_sizes):
        from servelab.engine.cuda_graphs import DecodeGraphs

        class _Eager(DecodeGraphs):
            def run(self, ids, positions, slots, table_rows):
                key = self.bucket(len(ids), max(positions) // self.pool.block_size + 1)
                self.load(self.pack(ids, positions, slots, table_rows, key[0]))
                return self._forward(*key)[: len(ids)]

        return _Eager(
            lm.model,
            lm.pool,
            lm.tables,
            max_batch=lm.max_rows,
            scratch_block=lm.engine.num_blocks,
            batch_sizes=batch_sizes,
        )


def test_graph_input_path_with_padding_rows_stays_exact(pair):
    hf, _, _, prompts, refs = pair
    draft = load_model("config:tiny-llama" if hf.config.model_type == "llama" else "config:tiny-gpt2", seed=9).model
    t = PagedLM.from_hf(hf, 128, 9, name="target", block_size=4)
    d = PagedLM.from_hf(draft, 128, 2, name="draft", block_size=4)
    t.graphs = EagerGraphs(t, (1, 2, 4, 8, 9))  # a verify of 5 rows runs in the 8-row bucket: 3 padding rows
    d.graphs = EagerGraphs(d, (1, 2))
    dec = SpeculativeDecoder(t, d, gamma=4)
    assert [dec.generate(p, GREEDY).tokens for p in prompts] == refs
    assert t.graph_steps > 0 and t.eager_steps == len(prompts)  # only the prefills ran outside the graph path


def test_chained_baseline_is_the_targets_greedy_output(pair):
    from servelab.spec.decoder import autoregressive_chained

    _, t, _, prompts, refs = pair
    assert [autoregressive_chained(t, p, GREEDY, chain=5).tokens for p in prompts] == refs
    stop = refs[0][6]
    gen = autoregressive_chained(
        t, prompts[0], SamplingParams(max_tokens=STEPS, stop_token_ids=(stop,), ignore_eos=True)
    )
    assert gen.tokens == refs[0][: refs[0].index(stop) + 1] and gen.finish_reason == "stop"
