"""What proposes the γ tokens of a round: a draft model (``DraftProposer``), or a search of the context
(``prompt_lookup.PromptLookupProposer``). The loop sees both through ``Proposer``.

A draft model drafts one decode step per token and remembers the distributions it drew them from.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from servelab.engine.sequence import SamplingParams
from servelab.spec.acceptance import probabilities
from servelab.spec.paged_lm import PagedLM


class Proposal(NamedTuple):
    tokens: list[int]  # x_1 … x_m, m ≤ γ (a draft model: m = γ; prompt lookup may propose fewer, or none)
    probs: torch.Tensor | None  # q_1 … q_m [m, vocab] (None when greedy: the match needs no q)


class Proposer(Protocol):
    """``lm``: the draft model's cache, which the loop prefills and rolls back with the target's, or None for
    a proposer that keeps no cache (nothing to prefill, nothing to roll back).
    ``propose(context, gamma, params, generator)``: up to γ tokens to follow ``context`` (the committed tokens,
    prompt included; the last one is the pending token no model has cached yet)."""

    lm: PagedLM | None

    def propose(
        self, context: list[int], gamma: int, params: SamplingParams, generator: torch.Generator | None = None
    ) -> Proposal: ...


def as_proposer(draft: PagedLM | Proposer) -> Proposer:
    """A draft model becomes a ``DraftProposer``; a proposer is taken as it is."""
    return DraftProposer(draft) if isinstance(draft, PagedLM) else draft


class DraftProposer:
    def __init__(self, lm: PagedLM):
        self.lm = lm

    def propose(
        self, context: list[int], gamma: int, params: SamplingParams, generator: torch.Generator | None = None
    ) -> Proposal:
        """γ tokens after ``context``, of which the draft has cached all but the last one (or two, after a
        round that kept every draft token). The γ draft steps run back to back on the device
        (``PagedLM.decode_chain``): each feeds the next without a trip to the host, which sees the γ tokens once."""
        pending = context[self.lm.num_cached :]
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
