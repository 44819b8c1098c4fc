"""Verifying a batch of requests' drafts at once (``speculative.rejection.verify``).

Greedy rows are the target's greedy output, and each equals the longest matching prefix of its own request alone.
Sampled rows keep the target's distribution: over tens of thousands of requests verified in one call (a small
vocabulary), the first emitted token follows the target's ``p_1`` (χ² goodness of fit, with a draft model and with
a proposer that proposes with certainty), a draft is kept as often as ``Σ min(p, q)`` says, and a bonus token
follows ``p_{k+1}``. The same χ² test rejects a verifier that keeps every draft, so it can fail. Ragged drafts,
greedy and sampled rows in one batch, and bad shapes. On a CUDA device (skipped without one) a step is verified
with no host synchronisation (``torch.cuda.set_sync_debug_mode("error")``).
"""

import numpy as np
import pytest
import torch
from scipy import stats

from servelab.errors import ParameterError
from servelab.speculative.rejection import PLACEHOLDER, verify

ALPHA = 1e-3  # a fit is rejected below this p-value; every draw is seeded, so a test gives the same answer each run


def dist(*weights) -> torch.Tensor:
    w = torch.tensor(weights, dtype=torch.float64)
    return (w / w.sum()).float()


P = [dist(5, 1, 2, 0.5, 1.5), dist(1, 1, 4, 2, 2), dist(3, 0.2, 1, 1, 4)]  # the target at positions 1, 2, 3
Q = [dist(1, 3, 1, 2, 1), dist(2, 2, 1, 1, 1)]  # the draft at positions 1, 2


def batch_of(n: int, drafts: torch.Tensor | None = None, seed: int = 0):
    """``n`` copies of one request with γ = 2: target logits from P, drafts drawn from Q (or ``drafts``)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.stack([p.log() for p in P])[None].expand(n, -1, -1).contiguous()
    q = torch.stack(Q)[None].expand(n, -1, -1).contiguous()
    if drafts is None:
        drafts = torch.stack([torch.multinomial(Q[i].expand(n, -1), 1, generator=g)[:, 0] for i in range(2)], 1)
    return logits, drafts, q, g


def chi2_p(tokens: torch.Tensor, p: torch.Tensor) -> float:
    counts = np.bincount(tokens.numpy(), minlength=p.numel())
    return stats.chisquare(counts, p.double().numpy() * counts.sum()).pvalue


def greedy_alone(logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """One request's greedy verification written out: the drafts kept (the longest prefix equal to the target's
    argmax) and the target's token after them."""
    best, d = logits.argmax(-1).tolist(), drafts.tolist()
    k = next((i for i in range(len(d)) if best[i] != d[i]), len(d))
    return k, best[k]


def test_greedy_rows_are_the_targets_argmax_and_each_is_greedy_alone():
    g = torch.Generator().manual_seed(1)
    batch, gamma, vocab = 64, 4, 11
    logits = torch.randn(batch, gamma + 1, vocab, generator=g)
    best = logits.argmax(-1)
    drafts = best[:, :gamma].clone()
    wrong = torch.rand(batch, gamma, generator=g) < 0.3  # about a third of the drafts miss
    drafts[wrong] = (drafts[wrong] + 1) % vocab
    num = torch.randint(0, gamma + 1, (batch,), generator=g)
    drafts[torch.arange(gamma)[None, :] >= num[:, None]] = PLACEHOLDER  # ragged: padding past each request's drafts
    out = verify(logits, drafts, num, torch.zeros(batch), all_greedy=True)
    for b in range(batch):
        k = int(num[b])
        kept, next_token = greedy_alone(logits[b, : k + 1], drafts[b, :k])
        emitted = int(out.emitted[b])
        assert emitted == kept + 1
        assert out.tokens[b, :emitted].tolist() == drafts[b, :kept].tolist() + [next_token]
        assert (out.tokens[b, emitted:] == PLACEHOLDER).all()
    assert (out.emitted == 1).any() and (out.emitted == num + 1).any()  # both ends of the range ran


def test_a_sampled_first_token_follows_the_target_and_drafts_are_kept_as_often_as_min_p_q_says():
    n = 60_000
    logits, drafts, q, g = batch_of(n)
    out = verify(logits, drafts, torch.full((n,), 2), torch.ones(n), draft_probs=q, generator=g)
    assert chi2_p(out.tokens[:, 0], P[0]) > ALPHA
    kept_first = (out.emitted >= 2).double().mean().item()
    expect = torch.minimum(P[0], Q[0]).sum().item()  # 1 - total variation
    assert abs(kept_first - expect) < 4 * (expect * (1 - expect) / n) ** 0.5
    bonus = out.tokens[out.emitted == 3, 2]  # all kept: the bonus position's token
    assert len(bonus) > 1000 and chi2_p(bonus, P[2]) > ALPHA


def test_a_proposer_without_a_distribution_keeps_the_targets_distribution_too():
    n = 40_000
    logits, _, _, g = batch_of(n)
    drafts = torch.tensor([[3, 2]]).expand(n, -1).contiguous()  # prompt lookup's certain proposal
    out = verify(logits, drafts, torch.full((n,), 2), torch.ones(n), generator=g)
    assert chi2_p(out.tokens[:, 0], P[0]) > ALPHA
    kept_first = (out.emitted >= 2).double().mean().item()
    assert abs(kept_first - P[0][3].item()) < 4 * (P[0][3].item() / n) ** 0.5  # kept with probability p(x)


def test_the_fit_rejects_a_verifier_that_keeps_every_draft():
    n = 60_000
    logits, drafts, q, g = batch_of(n)
    always = verify(
        logits, drafts, torch.full((n,), 2), torch.ones(n), draft_probs=torch.stack(P[:2])[None].expand(n, -1, -1)
    )
    # with q taken as p every draft is kept, so the first token follows the draft's Q, not P
    assert (always.emitted == 3).all()
    assert chi2_p(always.tokens[:, 0], P[0]) < ALPHA


def test_greedy_and_sampled_rows_share_a_batch_and_ragged_rows_draw_their_bonus_at_their_own_position():
    n = 30_000
    logits, drafts, q, g = batch_of(n, seed=3)
    temps = torch.tensor([0.0 if i % 2 else 1.0 for i in range(n)])
    num = torch.tensor([i % 3 for i in range(n)])  # 0, 1 or 2 drafts
    out = verify(logits, drafts, num, temps, draft_probs=q, generator=g)
    greedy = temps == 0
    alone = verify(logits[greedy], drafts[greedy], num[greedy], temps[greedy], all_greedy=True)
    assert torch.equal(out.tokens[greedy], alone.tokens)
    no_drafts = ~greedy & (num == 0)  # nothing to verify: the token is a plain sample of p_1
    assert (out.emitted[no_drafts] == 1).all() and chi2_p(out.tokens[no_drafts, 0], P[0]) > ALPHA
    assert (out.emitted <= num + 1).all()


def test_the_same_generator_seed_gives_the_same_tokens():
    logits, drafts, q, _ = batch_of(500)
    num, temps = torch.full((500,), 2), torch.full((500,), 0.8)
    a, b = (verify(logits, drafts, num, temps, draft_probs=q, generator=torch.Generator().manual_seed(7)) for _ in "ab")
    assert torch.equal(a.tokens, b.tokens)


LOGITS, DRAFTS, NUM, TEMPS = torch.zeros(2, 3, 5), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2), torch.ones(2)


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.zeros(2, 3), DRAFTS, NUM, TEMPS), "batch, γ \\+ 1, vocab"),
        ((LOGITS, torch.zeros(2, 3, dtype=torch.long), NUM, TEMPS), "LongTensor \\[2, 2\\]"),
        ((LOGITS, torch.zeros(2, 2), NUM, TEMPS), "LongTensor"),
        ((LOGITS, DRAFTS, torch.zeros(3), TEMPS), "num_drafts"),
        ((LOGITS, DRAFTS, NUM, torch.ones(1)), "temperatures must be \\[2\\]"),
        ((LOGITS, DRAFTS, NUM, TEMPS, False, torch.zeros(2, 3, 5)), "draft_probs"),
    ],
)
def test_bad_shapes_are_refused(args, message):
    with pytest.raises(ParameterError, match=message):
        verify(*args)


@pytest.mark.gpu
def test_on_the_gpu_a_step_is_verified_without_a_host_sync_and_greedy_rows_match_the_cpus():
    logits, drafts, q, _ = batch_of(4096, seed=5)
    num = torch.tensor([i % 3 for i in range(4096)])
    temps = torch.tensor([0.0 if i % 2 else 0.7 for i in range(4096)])
    cuda = [t.cuda() for t in (logits, drafts, num, temps, q)]
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any call that waits for the device raises
    try:
        out = verify(*cuda[:4], draft_probs=cuda[4], generator=g)
        greedy_only = verify(*cuda[:4], all_greedy=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = verify(logits, drafts, num, temps, all_greedy=True)
    greedy = temps == 0
    assert torch.equal(out.tokens.cpu()[greedy], want.tokens[greedy])
    assert torch.equal(greedy_only.tokens.cpu(), want.tokens)
