"""The draft proposes γ tokens, one decode step each, and remembers the distributions it drew them from."""

from __future__ import annotations

from typing import NamedTuple

import torch

from servelab.engine.sequence import SamplingParams
from servelab.speculative.acceptance import probabilities
from servelab.speculative.paged_lm import PagedLM


class Proposal(NamedTuple):
    tokens: list[int]               # x_1 … x_γ
    probs: torch.Tensor | None      # q_1 … q_γ [γ, vocab] (None when greedy: the match needs no q)


class DraftProposer:
    def __init__(self, lm: PagedLM):
        self.lm = lm

    def propose(self, pending: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> Proposal:
        """``pending``: committed tokens the draft has not cached yet (the last one, or two after a round that
        kept every draft token). Runs γ forwards: the first over ``pending``, then one per drafted token."""
        tokens, rows = [], []
        step_input = pending
        for _ in range(gamma):
            logits = self.lm.forward(step_input, last_only=True)
            if params.greedy:
                tok = int(logits[0].argmax())
            else:
                q = probabilities(logits, params.temperature, params.top_p)
                rows.append(q)
                tok = int(torch.multinomial(q[0], 1, generator=generator))
            tokens.append(tok)
            step_input = [tok]
        return Proposal(tokens, torch.cat(rows) if rows else None)
