"""The batched speculative loop (float32, CPU, tiny random models).

Free greedy speculation of a batch is token-identical to plain greedy decoding of each sequence (whose own
exactness against HF is ``test_spec_decoder``'s); a draft identical to the target is always accepted (every
round then ends with the draft's catch-up row); controlled acceptance follows the reference continuation and the
target's own acceptance agrees with it on every round; a round reads the device exactly once.
"""

import numpy as np
import pytest
import torch

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.spec import PagedLM, autoregressive
from servelab.spec.batch_decoder import BatchSpeculation, greedy_decode
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.controlled import ControlledAcceptance
from servelab.spec.syncs import HostSyncs

N = 14
BUCKETS = list(range(1, 41))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def models(request):
    target = load_model(f"config:{request.param}", seed=0).model
    draft = load_model(f"config:{request.param}", seed=7).model  # random: nearly always rejected
    g = torch.Generator().manual_seed(5)
    vocab = target.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 23, 9)]
    t = PagedBatch.from_hf(target, 96, 4, BUCKETS, name="target", block_size=4)
    d = PagedBatch.from_hf(draft, 96, 4, BUCKETS, name="draft", block_size=4)
    twin = PagedBatch.from_hf(target, 96, 4, BUCKETS, name="twin", block_size=4)
    ref = greedy_decode(t, prompts, N + 8)
    return target, t, d, twin, prompts, ref


def test_plain_batched_decoding_is_each_sequences_greedy_output(models):
    hf, t, _, _, prompts, ref = models
    one = PagedLM.from_hf(hf, 96, 2, block_size=4)
    for p, first, toks in zip(prompts, ref.first, ref.tokens, strict=True):
        alone = autoregressive(one, p, SamplingParams(max_tokens=N + 9, ignore_eos=True)).tokens
        assert alone == [first] + toks


@pytest.mark.parametrize("gamma", [1, 4])
def test_batched_speculation_equals_plain_greedy_decoding(models, gamma):
    _, t, d, _, prompts, ref = models
    gen = BatchSpeculation(t, d, gamma).generate(prompts, N)
    assert gen.tokens == [r[:N] for r in ref.tokens]
    assert gen.first == ref.first
    assert all(r.agreed == r.active for r in gen.rounds)
    assert gen.proposed == gamma * sum(r.active for r in gen.rounds)
    assert gen.draft_steps == gamma * len(gen.rounds) and gen.propose_ms == 0


def test_a_twin_draft_is_always_accepted_and_catches_up(models):
    _, t, _, twin, prompts, ref = models
    gen = BatchSpeculation(t, twin, 3).generate(prompts, N)
    assert gen.tokens == [r[:N] for r in ref.tokens]
    assert gen.accepted == gen.proposed  # every round kept all 3: the next round's first step has catch-up rows
    assert len(gen.rounds) == -(-N // 4)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 0.95])
def test_controlled_acceptance_follows_the_reference_and_the_target_agrees(models, alpha):
    _, t, d, _, prompts, ref = models
    ca = ControlledAcceptance(ref.tokens, alpha, t.vocab, seed=2)
    gen = BatchSpeculation(t, d, 4).generate(prompts, N, controlled=ca)
    assert gen.tokens == [r[:N] for r in ref.tokens]
    # float32: the target's own argmax on the device rejects exactly the overridden tokens it should
    assert sum(r.agreed for r in gen.rounds) == sum(r.active for r in gen.rounds)
    if alpha == 0.0:
        assert gen.accepted == 0


def test_a_round_reads_the_device_once(models):
    _, t, d, _, prompts, ref = models
    spec = BatchSpeculation(t, d, 3)
    state = spec.start(prompts, N, ControlledAcceptance(ref.tokens, 0.7, t.vocab, seed=4))
    counts = []
    while state.active:
        with HostSyncs("cpu") as s:
            spec.round(state)
        counts.append(s.count)
    spec.finish(state)
    assert len(counts) >= 3
    assert counts == [1] * len(counts)


def test_the_sync_counter_sees_a_read_and_restores_tensors():
    x = torch.arange(3)
    with HostSyncs("cpu") as s:
        x.tolist()
        float(x[0])
    assert s.count == 2
    with HostSyncs("cpu") as s2:
        pass
    x.tolist()
    assert s2.count == 0


def test_controlled_draws_keep_the_geometric_prefix():
    ref = [list(range(100))]
    alpha, gamma = 0.7, 4
    ca = ControlledAcceptance(ref, alpha, 1000, seed=0)
    ks = []
    for _ in range(4000):
        props, k = ca.draw(0, 10, gamma)
        assert props[:k] == ref[0][10 : 10 + k]
        if k < gamma:
            assert props[k] != ref[0][10 + k]
        ks.append(k)
    expected = sum(alpha**j for j in range(1, gamma + 1))  # E[k] for a prefix of Bernoulli(α) stopped at γ
    assert abs(np.mean(ks) - expected) < 0.06
    assert ca.next_tokens(0, 10, 2) == [10, 11, 12]


def test_bad_input_is_refused(models):
    _, t, d, _, prompts, ref = models
    with pytest.raises(ParameterError):
        ControlledAcceptance(ref.tokens, 1.5, t.vocab)
    with pytest.raises(ParameterError):
        BatchSpeculation(t, d, 0)
    with pytest.raises(ParameterError):
        greedy_decode(t, prompts, 0)
    with pytest.raises(ParameterError, match="too short"):
        ControlledAcceptance([[1, 2, 3]], 0.5, t.vocab).draw(0, 1, 4)
    with pytest.raises(ParameterError, match="no decode graph"):
        BatchSpeculation(t, d, 40).generate(prompts, 2)  # 3 × 41 verify rows: no bucket
