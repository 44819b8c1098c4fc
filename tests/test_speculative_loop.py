"""The staged speculative pieces composed into a greedy loop give the target's own greedy tokens.

A batch of ragged prompts decodes round by round: ``speculative.ngram.propose_ngram`` drafts for every request at
once, a tiny Llama (Hugging Face's, float32, on a CPU, recomputing each context whole: no KV cache to roll back)
scores each request's pending position and its drafts, ``speculative.rejection.verify`` keeps a prefix per
request and adds the target's token, and each request appends what it emitted. The tokens equal a plain greedy
loop's, request for request, while most rounds keep at least one draft: the pieces the engine's speculative mode
is built from agree with each other on what the output must be.

Sampled (temperature 1), with a tiny draft model far from the target (total variation about 0.7 at the first
token, so most first drafts are rejected and replaced): over 40,000 runs of a round with γ = 2, then a plain round
where the first emitted one token only, the first two tokens follow the target's own joint p(a)·p(b | a) (χ²), and
the same fit rejects a verifier that keeps every draft.
"""

import pytest
import torch

from servelab.speculative.ngram import propose_ngram
from servelab.speculative.rejection import PLACEHOLDER, verify

VOCAB, GAMMA, NEW = 24, 4, 24


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=2, vocab=VOCAB, hidden=32)


def tiny_llama(seed: int, layers: int, vocab: int, hidden: int, init: float = 0.02, **config):
    """A random Hugging Face Llama (float32, CPU); ``init``: the weights' standard deviation (HF's 0.02 by default);
    ``config``: further ``LlamaConfig`` keys (token ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        initializer_range=init,
        **config,
    )
    return LlamaForCausalLM(cfg).eval()


def logits_of(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def greedy(model, prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        out.append(int(logits_of(model, out)[-1].argmax()))
    return out[len(prompt) :]


def speculative(model, prompts: list[list[int]], n: int) -> tuple[list[list[int]], int, int]:
    """Every request's ``n`` new tokens by speculative rounds; (outputs, rounds, drafts kept)."""
    done = [list(p) for p in prompts]
    rounds = kept_total = 0
    while any(len(d) - len(p) < n for d, p in zip(done, prompts, strict=True)):
        live = [i for i, (d, p) in enumerate(zip(done, prompts, strict=True)) if len(d) - len(p) < n]
        width = max(len(done[i]) for i in live)
        history = torch.full((len(live), width), PLACEHOLDER, dtype=torch.long)
        for row, i in enumerate(live):
            history[row, : len(done[i])] = torch.tensor(done[i])
        lengths = torch.tensor([len(done[i]) for i in live])
        left = torch.tensor([n - (len(done[i]) - len(prompts[i])) for i in live])
        drafts, counts = propose_ngram(history, lengths, GAMMA, limits=left - 1)  # the last token is the target's
        scored = torch.zeros(len(live), GAMMA + 1, VOCAB)
        for row, i in enumerate(live):  # the pending position and each draft's, in one forward per request
            k = int(counts[row])
            full = logits_of(model, done[i] + drafts[row, :k].tolist())
            scored[row, : k + 1] = full[len(done[i]) - 1 :]
        out = verify(scored, drafts, counts, torch.zeros(len(live)), all_greedy=True)
        for row, i in enumerate(live):
            done[i] += out.tokens[row, : int(out.emitted[row])].tolist()
        rounds += 1
        kept_total += int((out.emitted - 1).sum())
    return [d[len(p) :] for d, p in zip(done, prompts, strict=True)], rounds, kept_total


def test_speculative_rounds_give_the_targets_greedy_tokens(target):
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(2, VOCAB, (5,), generator=g).tolist()
    prompts = [motif * 3, torch.randint(2, VOCAB, (7,), generator=g).tolist(), motif[:3] + motif * 2, [5]]
    outputs, rounds, kept = speculative(target, prompts, NEW)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out == greedy(target, prompt, NEW)
    assert kept > 0 and rounds < NEW  # drafts were kept: fewer rounds than tokens


SMALL_VOCAB, TRIALS = 8, 40_000


def next_logits(model, ctx: tuple, *extra: int) -> torch.Tensor:
    """The model's logits for the token after ``ctx + extra``."""
    return logits_of(model, list(ctx) + list(extra))[-1]


def first_two_tokens(target, draft, prompt: list[int], n: int, seed: int, keep_everything: bool = False):
    """``n`` independent sampled runs (temperature 1) of one speculative round with a draft model (γ = 2), then,
    where that round emitted one token only, a second round with nothing drafted: each run's first two tokens,
    and the target's p(a) and p(b | a) after the prompt."""
    g, ctx, v = torch.Generator().manual_seed(seed), tuple(prompt), SMALL_VOCAB
    # every context a run can reach, scored once: the prompt, the prompt + a, the prompt + a + b
    p0, q0 = next_logits(target, ctx), torch.softmax(next_logits(draft, ctx), -1)
    p1 = torch.stack([next_logits(target, ctx, a) for a in range(v)])
    q1 = torch.stack([torch.softmax(next_logits(draft, ctx, a), -1) for a in range(v)])
    p2 = torch.stack([torch.stack([next_logits(target, ctx, a, b) for b in range(v)]) for a in range(v)])
    d1 = torch.multinomial(q0.expand(n, -1), 1, generator=g)[:, 0]
    d2 = torch.multinomial(q1[d1], 1, generator=g)[:, 0]
    logits = torch.stack([p0.expand(n, -1), p1[d1], p2[d1, d2]], dim=1)
    q = torch.stack([q0.expand(n, -1), q1[d1]], dim=1)
    if keep_everything:  # a broken verifier: q taken as the target's own, so every draft is kept
        q = torch.softmax(logits[:, :2], -1)
    out = verify(logits, torch.stack([d1, d2], 1), torch.full((n,), 2), torch.ones(n), draft_probs=q, generator=g)
    first, second = out.tokens[:, 0], out.tokens[:, 1].clone()
    short = out.emitted == 1  # the first draft was rejected: its replacement is the round's only token
    m = int(short.sum())
    none = torch.zeros(m, 0, dtype=torch.long)
    again = verify(p1[first[short]][:, None], none, torch.zeros(m, dtype=torch.long), torch.ones(m), generator=g)
    second[short] = again.tokens[:, 0]
    return first, second, torch.softmax(p0, -1), torch.softmax(p1, -1)


def joint_fit(first, second, p_first, p_second) -> float:
    """χ² p-value of the runs' (first, second) pairs against the target's own joint p(a)·p(b | a); pairs expected
    fewer than 5 times are pooled into one cell."""
    from scipy import stats

    expect = (p_first[:, None] * p_second).flatten().double() * len(first)
    seen = torch.bincount(first * SMALL_VOCAB + second, minlength=SMALL_VOCAB**2).double()
    big = expect >= 5
    e, o = expect[big], seen[big]
    if (~big).any():
        e, o = torch.cat([e, expect[~big].sum()[None]]), torch.cat([o, seen[~big].sum()[None]])
    return stats.chisquare(o.numpy(), e.numpy() * o.sum().item() / e.sum().item()).pvalue


def test_sampled_rounds_with_a_draft_model_keep_the_targets_joint_distribution():
    # weights at 0.3: peaked enough that draft and target differ, flat enough that most pairs of tokens occur
    target = tiny_llama(seed=0, layers=2, vocab=SMALL_VOCAB, hidden=16, init=0.3)
    draft = tiny_llama(seed=1, layers=1, vocab=SMALL_VOCAB, hidden=16, init=0.3)
    first, second, p1, p2 = first_two_tokens(target, draft, [3, 5, 7], TRIALS, seed=0)
    assert joint_fit(first, second, p1, p2) > 1e-3
    broken = first_two_tokens(target, draft, [3, 5, 7], TRIALS, seed=0, keep_everything=True)
    assert joint_fit(*broken) < 1e-3  # the same fit catches a verifier that keeps every draft
