"""Which drafted tokens the target keeps, and the token it adds.

The draft proposed ``x_1 … x_γ``; the target scored γ + 1 positions in one forward, giving ``p_1 … p_{γ+1}``
(``p_i`` is the target's distribution for the token at draft position i; ``p_{γ+1}`` follows ``x_γ``).

- **Greedy** (temperature 0): keep the longest prefix where ``x_i = argmax p_i``; the next token is
  ``argmax p_{k+1}``. The output is the target's own greedy output, token for token.
- **Sampling** (Leviathan et al. 2023; Chen et al. 2023): keep ``x_i`` with probability
  ``min(1, p_i(x_i) / q_i(x_i))``, where ``q_i`` is the draft's distribution it was drawn from; at the first
  rejection draw the replacement from ``norm(max(0, p_i − q_i))``; if all γ are kept, draw a bonus token from
  ``p_{γ+1}``. Every emitted token is then distributed exactly as the target's own sample would be.

Both return ``Acceptance(accepted, next_token)``; greedy copies to the host once, sampling twice.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from servelab.engine.sampling import top_p_filter


class Acceptance(NamedTuple):
    accepted: int  # k: drafted tokens kept (0 … γ)
    next_token: int  # the target's token at position k + 1 (a correction, or the bonus when k = γ)


def probabilities(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution ``[n, vocab]`` (float32) that temperature and top-p define over ``logits``."""
    if temperature <= 0:
        raise ValueError("probabilities need temperature > 0; greedy decoding uses argmax")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        probs = top_p_filter(probs, torch.full((probs.shape[0],), float(top_p), device=probs.device))
    return probs


def greedy_accept(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> Acceptance:
    """``target_logits`` [γ+1, vocab], ``draft_tokens`` LongTensor [γ] (same device)."""
    gamma = draft_tokens.shape[0]
    _check(target_logits, gamma)
    best = target_logits.argmax(dim=-1).tolist()  # [γ+1], one device-to-host copy
    drafts = draft_tokens.tolist()
    k = next((i for i in range(gamma) if best[i] != drafts[i]), gamma)
    return Acceptance(k, best[k])


def rejection_accept(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """The Leviathan/Chen rule. ``target_probs`` [γ+1, vocab], ``draft_probs`` [γ, vocab] (rows sum to 1),
    ``draft_tokens`` LongTensor [γ]; ``generator`` on the same device makes the draws reproducible."""
    gamma = draft_tokens.shape[0]
    _check(target_probs, gamma)
    if draft_probs.shape != (gamma, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [{gamma}, {target_probs.shape[1]}], got {tuple(draft_probs.shape)}")
    rows = torch.arange(gamma, device=draft_tokens.device)
    p_x = target_probs[rows, draft_tokens]
    q_x = draft_probs[rows, draft_tokens]
    u = torch.rand(gamma, generator=generator, device=target_probs.device)
    # u < p/q written without the division: q(x) > 0 for a token the draft drew
    rejected = (u * q_x >= p_x).long()
    k = int(torch.cat([rejected, rejected.new_ones(1)]).argmax())
    if k < gamma:
        residual = (target_probs[k] - draft_probs[k]).clamp_(min=0)
        total = residual.sum()
        # p = q exactly leaves no residual mass, and then a rejection has probability 0: guard rounding
        dist = residual / total if total > 0 else target_probs[k]
    else:
        dist = target_probs[gamma]
    return Acceptance(k, int(torch.multinomial(dist, 1, generator=generator)))


def _check(target: torch.Tensor, gamma: int) -> None:
    if target.dim() != 2 or target.shape[0] != gamma + 1:
        raise ValueError(f"the target must score gamma + 1 = {gamma + 1} positions, got shape {tuple(target.shape)}")
