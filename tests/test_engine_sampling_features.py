"""vLLM's sampling features in the engine, each against a reference computed from the same logits.

The batched device ops (``logits_processing.py``, ``sampling.py``, ``logprobs.py``) are compared with a plain
per-row loop written from the definitions; then the engine end to end: raw logprobs and prompt logprobs equal
HF's ``log_softmax`` on the same weights (float32), chunked or cached or not, and the plain batch still takes
the fast path without touching the processors.
"""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams, Sequence
from servelab.engine import sampling as sampling_mod
from servelab.engine.logits_processing import process_logits
from servelab.engine.logprobs import logprobs_of
from servelab.engine.sampling import min_p_filter, sample_step, top_k_filter
from servelab.errors import ParameterError
from servelab.models import load_model

VOCAB = 50
EOS = 2


def seq(prompt, out, **kw) -> Sequence:
    s = Sequence(list(prompt), SamplingParams(max_tokens=64, **kw))
    s.output_token_ids = list(out)
    return s


def reference_process(logits: torch.Tensor, s: Sequence, eos=(EOS,)) -> torch.Tensor:
    """One row, straight from the definitions (vLLM's order)."""
    x = logits.clone().double()
    p = s.params
    for t in set(s.prompt_token_ids) | set(s.output_token_ids):
        if p.repetition_penalty != 1:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(s.output_token_ids):
        x[t] -= p.frequency_penalty * s.output_token_ids.count(t) + p.presence_penalty
    for t, b in p.logit_bias:
        x[t] += b
    if len(s.output_token_ids) < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos)):
            x[t] = float("-inf")
    return x.float()


def test_processors_match_a_per_row_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB, generator=g) * 3
    seqs = [
        seq([3, 4, 5], [6, 6, 7], repetition_penalty=1.7),
        seq([3, 4], [9, 9, 9, 10], frequency_penalty=0.7, presence_penalty=-0.4),
        seq([1], [], logit_bias=((11, 5.0), (12, -100.0))),
        seq([1], [4], min_tokens=3, stop_token_ids=(7, 8)),
        seq([8, 8], [1, 2, 3], repetition_penalty=0.8, frequency_penalty=1.0, logit_bias=((8, 1.0),)),
    ]
    got = process_logits(logits, seqs, (EOS,))
    want = torch.stack([reference_process(logits[i], s) for i, s in enumerate(seqs)])
    torch.testing.assert_close(got, want)
    assert torch.equal(logits, torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0)) * 3)  # untouched


def test_top_k_and_min_p_masks_match_a_sort_reference():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(4, VOCAB, generator=g), dim=-1)
    ks = torch.tensor([0, 1, 5, VOCAB + 10])
    got = top_k_filter(probs, ks)
    for i, k in enumerate(ks.tolist()):
        keep = probs[i].argsort(descending=True)[: (VOCAB if k == 0 else min(k, VOCAB))]
        want = torch.zeros(VOCAB)
        want[keep] = probs[i][keep]
        torch.testing.assert_close(got[i], want)
    min_p = torch.tensor([0.0, 0.5, 0.9, 1.0])
    got = min_p_filter(probs, min_p)
    for i, m in enumerate(min_p.tolist()):
        want = torch.where(probs[i] >= m * probs[i].max(), probs[i], torch.zeros(()))
        torch.testing.assert_close(got[i], want)


def test_logprobs_are_log_softmax_of_the_raw_logits_with_ranks():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, VOCAB, generator=g)
    tokens = torch.tensor([4, 9, 0])
    lp = logprobs_of(logits, tokens, [0, 3, 5]).to_host()
    ref = torch.log_softmax(logits.double(), dim=-1)
    for i, t in enumerate(tokens.tolist()):
        assert lp[i].token_id == t and lp[i].logprob == pytest.approx(ref[i, t].item(), abs=1e-5)
        assert lp[i].rank == int((ref[i] > ref[i, t]).sum()) + 1
        top = ref[i].topk(len(lp[i].top))
        assert [a for a, _ in lp[i].top] == top.indices.tolist()
        assert [b for _, b in lp[i].top] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert [len(x.top) for x in lp] == [0, 3, 5]


def test_sampled_logprobs_score_the_sampled_token_under_the_raw_distribution():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, VOCAB, generator=g)
    seqs = [
        seq([1], [5], logprobs=2, presence_penalty=2.0),  # greedy, penalized: the token moves, the logprob is raw
        seq([1], [], logprobs=0, temperature=0.8, top_k=3, seed=7),
        seq([1], []),
    ]
    for s in seqs:
        if s.params.seed is not None:
            s.generator = torch.Generator().manual_seed(s.params.seed)
    tokens, lps = sample_step(logits, seqs, eos_token_ids=(EOS,))
    assert tokens[0] == reference_process(logits[0], seqs[0]).argmax()
    assert tokens[1] in logits[1].topk(3).indices
    rows = lps.per_row(3)
    ref = torch.log_softmax(logits, dim=-1)
    for i in (0, 1):
        assert rows[i].token_id == tokens[i] and rows[i].logprob == pytest.approx(ref[i, tokens[i]].item(), abs=1e-5)
    assert rows[2] is None and len(rows[0].top) == 2


def test_the_plain_batch_never_reaches_the_processors(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("processors ran for a plain batch")

    monkeypatch.setattr(sampling_mod, "process_logits", boom)
    logits = torch.randn(4, VOCAB)
    seqs = [seq([1], []) for _ in range(2)] + [seq([1], [], temperature=0.7, top_p=0.9) for _ in range(2)]
    tokens, lps = sample_step(logits, seqs)
    assert lps is None and tokens[:2].tolist() == logits[:2].argmax(-1).tolist()


def test_top_k_1_is_greedy_whatever_the_temperature():
    logits = torch.randn(6, VOCAB)
    seqs = [seq([1], [], temperature=1.5, top_k=1) for _ in range(6)]
    assert sample_step(logits, seqs)[0].tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "kw",
    [
        {"top_k": -2},
        {"min_p": 1.5},
        {"presence_penalty": 2.5},
        {"frequency_penalty": float("nan")},
        {"repetition_penalty": 0.0},
        {"min_tokens": 65},
        {"logprobs": 21},
        {"prompt_logprobs": -1},
        {"logit_bias": ((3, 200.0),)},
    ],
)
def test_out_of_range_settings_are_parameter_errors(kw):
    with pytest.raises(ParameterError):
        SamplingParams(max_tokens=64, **kw)


# ---- the engine end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf():
    return load_model("config:tiny-llama").model


def engine(hf, **cfg) -> Engine:
    return Engine.from_hf(hf, EngineConfig(num_blocks=256, **cfg))


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)


PROMPT = list(range(10, 50))  # 40 tokens: 2.5 blocks of 16


@pytest.mark.parametrize("cfg", [{}, {"max_num_batched_tokens": 16, "max_num_seqs": 4}, {"prefix_caching": True}])
def test_prompt_and_sampled_logprobs_equal_hf(hf, cfg):
    e = engine(hf, **cfg)
    if cfg.get("prefix_caching"):  # the prompt is cached already: prompt logprobs must compute it anyway
        e.generate([PROMPT], SamplingParams(max_tokens=2))
    s = e.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2))
    events = [ev for ev in e.stream() if ev.seq_id == s.seq_id]
    ref = hf_logprobs(hf, PROMPT + s.output_token_ids)
    assert len(s.prompt_logprobs) == len(PROMPT) and s.prompt_logprobs[0] is None
    for p in range(1, len(PROMPT)):
        lp = s.prompt_logprobs[p]
        assert lp.token_id == PROMPT[p] and lp.logprob == pytest.approx(ref[p - 1, PROMPT[p]].item(), abs=1e-4)
        assert [t for t, _ in lp.top] == ref[p - 1].topk(2).indices.tolist()
    assert len(events) == len(s.output_token_ids) == 6  # one event a sampled token: the loop below sees all six
    for k, ev in enumerate(events):
        pos = len(PROMPT) - 1 + k
        assert ev.logprobs.token_id == ev.token_id == ref[pos].argmax().item()  # greedy: rank 1
        assert ev.logprobs.rank == 1
        assert ev.logprobs.logprob == pytest.approx(ref[pos, ev.token_id].item(), abs=1e-4)
    assert e.leaked() == []


def test_logprobs_do_not_change_greedy_tokens(hf):
    prompts = [PROMPT, [5, 6, 7], list(range(100, 130))]
    plain = engine(hf).generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    asked = engine(hf).generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=5, prompt_logprobs=1))
    assert plain == asked


def test_penalties_apply_to_every_step_with_async_scheduling(hf):
    # a presence penalty of 2 outweighs the spread of this random model's logits: no token may come twice
    e = engine(hf)
    assert e.config.async_scheduling
    out = e.generate([PROMPT], SamplingParams(max_tokens=40, ignore_eos=True, presence_penalty=2.0))[0]
    assert len(set(out)) == len(out)
    ref = engine(hf).generate([PROMPT], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert len(set(ref)) < len(ref)  # without it the model repeats itself (the test can fail)


def test_min_tokens_holds_eos_back(hf):
    e = engine(hf)
    eos = e.scheduler.eos_token_ids[0]
    forced = SamplingParams(max_tokens=10, logit_bias=((eos, 100.0),), min_tokens=4)
    out = e.generate([PROMPT], forced)[0]
    assert len(out) == 5 and out[-1] == eos and eos not in out[:-1]
    assert e.generate([PROMPT], SamplingParams(max_tokens=10, logit_bias=((eos, 100.0),)))[0] == [eos]
