"""The draft proposes γ tokens, one decode step each, and remembers the distributions it drew them from."""

from __future__ import annotations

from typing import NamedTuple

import torch

from servelab.engine.sequence import SamplingParams
from servelab.spec.acceptance import probabilities
from servelab.spec.paged_lm import PagedLM


class Proposal(NamedTuple):
    tokens: list[int]  # x_1 … x_γ
    probs: torch.Tensor | None  # q_1 … q_γ [γ, vocab] (None when greedy: the match needs no q)


class DraftProposer:
    def __init__(self, lm: PagedLM):
        self.lm = lm

    def propose(
        self, pending: list[int], gamma: int, params: SamplingParams, generator: torch.Generator | None = None
    ) -> Proposal:
        """``pending``: committed tokens the draft has not cached yet (the last one, or two after a round that
        kept every draft token). The γ draft steps run back to back on the device (``PagedLM.decode_chain``):
        each feeds the next without a trip to the host, which sees the γ tokens once."""
        rows: list[torch.Tensor] = []

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if params.greedy:
                return logits.argmax(dim=-1)
            q = probabilities(logits, params.temperature, params.top_p)
            rows.append(q)
            return torch.multinomial(q, 1, generator=generator)[:, 0]

        if len(pending) > 1:  # catch up on the previous round's last draft: its K/V only, its logits are not needed
            self.lm.forward(pending[:-1])
        tokens = self.lm.decode_chain(pending[-1], gamma, pick)
        if tokens is None:  # no graph bucket holds the chain: one step at a time
            rows.clear()
            tokens, step_input = [], [pending[-1]]
            for _ in range(gamma):
                tok = int(pick(self.lm.forward(step_input, last_only=True))[0])
                tokens.append(tok)
                step_input = [tok]
        return Proposal(tokens, torch.cat(rows) if rows else None)
