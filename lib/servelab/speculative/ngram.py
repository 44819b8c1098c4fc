"""Prompt lookup (vLLM's ``"method": "ngram"``) for every request of a step at once, on the device.

Each request's drafts are those of ``prompt_lookup.PromptLookupProposer.lookup``, token for token: draft i is
the token that followed the latest earlier occurrence of the longest suffix (``max_ngram`` down to ``min_ngram``
tokens) of the context extended by drafts 1 … i − 1, and the drafts stop at the first position with no match.
That proposer searches one request's context on the host; here the contexts of a whole batch sit in one padded
tensor ``[B, L]`` and each of the γ positions is one pass of tensor comparisons over every window, so the search
needs no host synchronisation and no per-request Python: the step that verifies the drafts can launch right
after, and the host reads the outcome once per round.

Cost: γ · Σ_n (L · n) comparisons per request; at L = 4,096, γ = 4 and n = 3, 2, 1 about 100k, nothing beside a
forward pass.
"""

from __future__ import annotations

import torch

from servelab.errors import ParameterError
from servelab.speculative.rejection import PLACEHOLDER


def propose_ngram(
    history: torch.Tensor,
    lengths: torch.Tensor,
    gamma: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
    limits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``history`` [B, L] each request's committed tokens (prompt and output), left-aligned, anything past
    ``lengths`` [B]; up to ``gamma`` drafts each (at most ``limits`` [B], e.g. the tokens it still may produce).
    Returns (drafts [B, γ], PLACEHOLDER past each request's count; counts [B])."""
    _check(history, lengths, gamma, max_ngram, min_ngram, limits)
    batch, width = history.shape
    device = history.device
    ids = torch.cat([history, history.new_full((batch, gamma), PLACEHOLDER)], dim=1)
    cur = lengths.clone().long()
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    if limits is not None:
        alive &= limits > 0
    drafts = history.new_full((batch, gamma), PLACEHOLDER)
    starts = torch.arange(width + gamma, device=device)
    rows = torch.arange(batch, device=device)
    for i in range(gamma):
        token = torch.full((batch,), PLACEHOLDER, dtype=ids.dtype, device=device)
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        for n in range(max_ngram, min_ngram - 1, -1):
            usable = alive & ~found & (cur - 1 >= n)  # the suffix must have an earlier window before it
            suffix = ids.gather(1, (cur[:, None] - n + torch.arange(n, device=device)).clamp(min=0))  # [B, n]
            windows = ids.unfold(1, n, 1)  # [B, W - n + 1, n]: the window starting at each position
            window_starts = starts[None, : windows.shape[1]]
            match = (windows == suffix[:, None, :]).all(dim=2)
            # a window must end before the suffix starts its last token: start s ≤ cur − n − 1
            match &= window_starts <= (cur - n - 1)[:, None]
            latest = torch.where(match, window_starts, -1).max(dim=1).values
            hit = usable & (latest >= 0)
            follow = ids[rows, (latest + n).clamp(min=0, max=ids.shape[1] - 1)]
            token = torch.where(hit, follow, token)
            found |= hit
        alive &= found
        if limits is not None:
            alive &= limits > i
        drafts[:, i] = torch.where(alive, token, PLACEHOLDER)
        at = cur.clamp(max=ids.shape[1] - 1)  # a request that stopped writes its own token back
        ids[rows, at] = torch.where(alive, token, ids[rows, at])
        cur = cur + alive.long()
    return drafts, (drafts != PLACEHOLDER).sum(dim=1)


def _check(history, lengths, gamma, max_ngram, min_ngram, limits) -> None:
    for name, v in (("gamma", gamma), ("max_ngram", max_ngram), ("min_ngram", min_ngram)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive int, got {v!r}")
    if min_ngram > max_ngram:
        raise ParameterError(f"min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
    if history.dim() != 2 or history.dtype != torch.long:
        raise ParameterError(
            f"history must be a LongTensor [batch, tokens], got {history.dtype} {tuple(history.shape)}"
        )
    if lengths.shape != (history.shape[0],):
        raise ParameterError(f"lengths must be [{history.shape[0]}], got {tuple(lengths.shape)}")
    if limits is not None and limits.shape != (history.shape[0],):
        raise ParameterError(f"limits must be [{history.shape[0]}], got {tuple(limits.shape)}")
