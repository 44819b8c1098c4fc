"""The staged speculative pieces composed into a greedy loop give the target's own greedy tokens.

A batch of ragged prompts decodes round by round: ``speculative.ngram.propose_ngram`` drafts for every request at
once, a tiny Llama (Hugging Face's, float32, on a CPU, recomputing each context whole: no KV cache to roll back)
scores each request's pending position and its drafts, ``speculative.rejection.verify`` keeps a prefix per
request and adds the target's token, and each request appends what it emitted. The tokens equal a plain greedy
loop's, request for request, while most rounds keep at least one draft: the pieces the engine's speculative mode
is built from agree with each other on what the output must be.
"""

import pytest
import torch

from servelab.speculative.ngram import propose_ngram
from servelab.speculative.rejection import PLACEHOLDER, verify

VOCAB, GAMMA, NEW = 24, 4, 24


@pytest.fixture(scope="module")
def target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
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
