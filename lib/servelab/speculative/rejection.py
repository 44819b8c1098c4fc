"""Which drafted tokens the target keeps, for every request of a step at once.

In a speculative step each running request ``b`` proposed ``num_drafts[b] ≤ γ`` tokens ``x_1 … x_k`` and the target
scored ``k + 1`` positions in the same forward, giving logits ``[B, γ + 1, vocab]`` (rows past ``k + 1`` are
padding). Per request:

- **greedy** (temperature 0): keep the longest prefix where ``x_i = argmax``; then emit the argmax at the first
  mismatch (or, all kept, the bonus position's): the target's own greedy output, token for token;
- **sampled** (Leviathan et al. 2023, Chen et al. 2023): keep ``x_i`` with probability ``min(1, p_i(x_i)/q_i(x_i))``;
  at the first rejection draw from ``norm(max(0, p_i − q_i))``; all kept, draw the bonus from ``p_{k+1}``. Every
  emitted token is then distributed as the target's own sample. A proposer without a distribution (n-gram
  prompt lookup) proposes with certainty: ``q`` is one-hot at its token, as vLLM treats it.

Batched, ragged and without a host synchronisation: one uniform per draft, the leading run of kept drafts by a
cumulative product, and one ``multinomial`` draw per request over its residual, so a captured step can run it and
the host reads the result once. The output is ``[B, γ + 1]`` token ids, the emitted tokens first and
``PLACEHOLDER`` after them (vLLM's layout), with the count each request emitted.

Temperatures come as a tensor on the device (0 for a greedy request), with the host's word on whether every
request is greedy (vLLM's ``SamplingMetadata.all_greedy``): the host knows each request's sampling parameters, so
an all-greedy step never builds the softmax and nothing is read back to decide. Top-p/top-k filtering belongs to
the caller's sampler: pass logits already filtered.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from servelab.errors import ParameterError

PLACEHOLDER = -1  # a position past what a request emitted this step


class Verified(NamedTuple):
    tokens: torch.Tensor  # [B, γ + 1]: kept drafts, then the correction or bonus, then PLACEHOLDER
    emitted: torch.Tensor  # [B]: tokens emitted (kept drafts + 1)


def verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    temperatures: torch.Tensor,
    all_greedy: bool = False,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Verified:
    """``target_logits`` [B, γ + 1, V]; ``draft_tokens`` [B, γ] (any padding past ``num_drafts``, PLACEHOLDER
    included); ``num_drafts`` [B]
    (0 … γ); ``temperatures`` [B], 0 for a greedy request; ``all_greedy``: every request is (the softmax is
    skipped); ``draft_probs`` [B, γ, V], the draft's distributions
    the tokens were drawn from (None: a proposer that proposes with certainty); ``generator`` on the device makes
    the draws reproducible."""
    batch, positions, vocab = _check(target_logits, draft_tokens, num_drafts, temperatures, draft_probs)
    gamma, device = positions - 1, target_logits.device
    rows = torch.arange(batch, device=device)
    valid = torch.arange(gamma, device=device)[None, :] < num_drafts[:, None]
    best = target_logits.argmax(dim=-1)  # [B, γ + 1]
    greedy_kept = best[:, :gamma] == draft_tokens
    if all_greedy:
        kept = _leading(greedy_kept & valid)
        return _emit(draft_tokens, kept, best[rows, kept])
    greedy = temperatures <= 0
    scale = torch.where(greedy, 1.0, temperatures.float())
    probs = torch.softmax(target_logits.float() / scale[:, None, None], dim=-1)
    ids = draft_tokens.clamp(min=0)[..., None]  # padding may be PLACEHOLDER; those positions are never kept
    p_x = probs[:, :gamma].gather(-1, ids)[..., 0]
    q_x = p_x.new_ones(()) if draft_probs is None else draft_probs.gather(-1, ids)[..., 0]
    u = torch.rand(batch, gamma, generator=generator, device=device)
    sampled_kept = u * q_x < p_x  # u < p/q without the division: q(x) > 0 for a token the draft proposed
    kept = _leading(torch.where(greedy[:, None], greedy_kept, sampled_kept) & valid)
    p_next = probs[rows, kept]  # [B, V]: the target at the first rejected draft, or at the bonus position
    at = kept.clamp(max=max(gamma - 1, 0))
    if gamma == 0:
        q_next = torch.zeros_like(p_next)
    elif draft_probs is None:
        q_next = torch.nn.functional.one_hot(draft_tokens[rows, at].clamp(min=0), vocab).to(p_next.dtype)
    else:
        q_next = draft_probs[rows, at].float()
    q_next = q_next * (kept < num_drafts)[:, None]  # all kept: the bonus is drawn from p alone
    residual = (p_next - q_next).clamp(min=0)
    # p = q leaves no residual mass, and then a rejection had probability 0: rounding's case, fall back to p
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    drawn = torch.multinomial(residual, 1, generator=generator)[:, 0]
    return _emit(draft_tokens, kept, torch.where(greedy, best[rows, kept], drawn))


def _leading(kept: torch.Tensor) -> torch.Tensor:
    """[B, γ] bool -> [B]: how many drafts are kept before the first that is not."""
    return torch.cumprod(kept.long(), dim=1).sum(dim=1)


def _emit(draft_tokens: torch.Tensor, kept: torch.Tensor, next_token: torch.Tensor) -> Verified:
    batch, gamma = draft_tokens.shape
    tokens = draft_tokens.new_full((batch, gamma + 1), PLACEHOLDER)
    before = torch.arange(gamma, device=draft_tokens.device)[None, :] < kept[:, None]
    tokens[:, :gamma] = torch.where(before, draft_tokens, PLACEHOLDER)
    tokens.scatter_(1, kept[:, None], next_token[:, None].to(tokens.dtype))
    return Verified(tokens, kept + 1)


def _check(target_logits, draft_tokens, num_drafts, temperatures, draft_probs) -> tuple[int, int, int]:
    if target_logits.dim() != 3:
        raise ParameterError(f"target_logits must be [batch, γ + 1, vocab], got {tuple(target_logits.shape)}")
    batch, positions, vocab = target_logits.shape
    if draft_tokens.shape != (batch, positions - 1) or draft_tokens.dtype != torch.long:
        raise ParameterError(
            f"draft_tokens must be a LongTensor [{batch}, {positions - 1}], got {draft_tokens.dtype} "
            f"{tuple(draft_tokens.shape)}"
        )
    if num_drafts.shape != (batch,):
        raise ParameterError(f"num_drafts must be [{batch}], got {tuple(num_drafts.shape)}")
    if temperatures.shape != (batch,):
        raise ParameterError(f"temperatures must be [{batch}], got {tuple(temperatures.shape)}")
    if draft_probs is not None and draft_probs.shape != (batch, positions - 1, vocab):
        raise ParameterError(f"draft_probs must be [{batch}, {positions - 1}, {vocab}], got {tuple(draft_probs.shape)}")
    return batch, positions, vocab
