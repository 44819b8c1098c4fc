"""What a speculative step proposed and what the target kept, counted as vLLM's speculative metrics count it.

vLLM exports, per engine: ``spec_decode_num_drafts`` (requests that proposed in a step, summed over steps),
``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens`` and ``spec_decode_num_accepted_tokens_per_pos``
(a counter per draft position: how often the draft at position j was kept). From those a dashboard derives the
acceptance rate (accepted / draft tokens), the mean acceptance length (1 + accepted / drafts) and the acceptance at
each position. ``SpecDecodeStats.observe`` takes one step's outcome after the host read it (``rejection.Verified``
and the drafts each request proposed); the server's ``/metrics`` will export the totals under vLLM's names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.errors import ParameterError


@dataclass
class SpecDecodeStats:
    """Running totals over steps; ``per_position[j]``: drafts at position j (0-based) that were kept."""

    num_spec_tokens: int  # γ: the positions counted
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # request-steps that rejected a draft: with the kept drafts, α's estimate (``leviathan.alpha_mle``)
    num_rejections: int = 0
    per_position: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.num_spec_tokens < 1:
            raise ParameterError(f"num_spec_tokens must be >= 1, got {self.num_spec_tokens}")
        self.per_position = self.per_position or [0] * self.num_spec_tokens

    def observe(self, proposed: Sequence[int], emitted: Sequence[int]) -> None:
        """One step: each request's drafts proposed and tokens emitted (kept drafts + 1). A request that proposed
        nothing (prompt lookup without a match) took a plain step and counts for nothing here."""
        if len(proposed) != len(emitted):
            raise ParameterError(f"{len(proposed)} proposals for {len(emitted)} requests")
        for k, e in zip(proposed, emitted, strict=True):
            kept = e - 1
            if not 0 <= k <= self.num_spec_tokens or not 0 <= kept <= k:
                raise ParameterError(f"a request proposed {k} and emitted {e}: outside 0 ≤ kept ≤ proposed ≤ γ")
            if k == 0:
                continue
            self.num_drafts += 1
            self.num_draft_tokens += k
            self.num_accepted_tokens += kept
            self.num_rejections += kept < k
            for j in range(kept):
                self.per_position[j] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens (NaN before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a speculating request emits per step: 1 + accepted / drafts (NaN before any)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")
