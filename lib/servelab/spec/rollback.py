"""Rollback of both KV caches to the accepted prefix after a round ("KV sync").

Before a round of γ drafts, both caches hold the committed tokens except the last one (``committed - 1``
tokens; the draft may lag one more after a round that kept everything). After it:

- the target has cached ``committed + γ`` tokens (its input: the pending token and the γ drafts) and keeps
  ``committed + k``: the accepted drafts are now committed, the new token (correction or bonus) is pending;
- the draft has cached ``committed + γ - 1`` (it never ran its own last draft) and keeps
  ``committed + min(k, γ - 1)``. When all γ were kept, it lags by the last draft, whose K/V it computes at
  the start of the next round, before it drafts from the pending token.

A proposer without a cache (prompt lookup, ``draft=None``) drafts nothing on a device: only the target rolls back,
and γ is the number of tokens it proposed (possibly fewer than asked, or none).

On the paged cache a rollback is host bookkeeping: blocks past the prefix go back to the free list.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from servelab.spec.paged_lm import PagedLM


class KVSync(NamedTuple):
    target_dropped: int  # tokens rolled back
    draft_dropped: int
    seconds: float  # host time of both truncations


def rollback(target: PagedLM, draft: PagedLM | None, committed_before: int, accepted: int, gamma: int) -> KVSync:
    """Truncate both caches after a round that started with ``committed_before`` committed tokens and kept
    ``accepted`` of ``gamma`` drafts (``draft`` None: the target's alone)."""
    t0 = time.perf_counter()
    keep_t = committed_before + accepted
    keep_d = committed_before + min(accepted, gamma - 1)
    dt = target.num_cached - keep_t
    dd = 0 if draft is None else draft.num_cached - keep_d
    if dt < 0 or dd < 0:
        held = "none" if draft is None else draft.num_cached
        raise RuntimeError(
            f"rollback past the caches: target {target.num_cached} -> {keep_t}, draft {held} -> {keep_d}"
        )
    target.truncate(keep_t)
    if draft is not None:
        draft.truncate(keep_d)
    return KVSync(dt, dd, time.perf_counter() - t0)
