"""Controlled acceptance: proposals whose acceptance rate is set, not learned.

Acceptance needs trained weights; cost needs only the shapes. To measure the cost side at the seed's shapes with
random weights, the draft runs every step as usual, and then its proposal at each position is overridden: with
probability α it is the target's own greedy token there (from a reference continuation the target computed
first), otherwise a token the target rejects (the reference token + 1, mod the vocabulary). Every draw is
independent, which is exactly the assumption of Leviathan et al.'s formula, so a round keeps k drafts with
P(k) = α^k (1 − α) for k < γ and α^γ for k = γ, and every cost in the round is the real one.
"""

from __future__ import annotations

import numpy as np

from servelab.errors import ParameterError


class ControlledAcceptance:
    """``ControlledAcceptance(reference, alpha, vocab, seed)``: ``reference[i]`` is sequence i's greedy decode
    tokens (after the prompt's first token), at least ``max_new_tokens + γ`` long (the proposals reach
    ``emitted + γ − 1``, the token after them ``emitted + γ``)."""

    def __init__(self, reference: list[list[int]], alpha: float, vocab: int, seed: int = 0):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ParameterError(f"alpha must be a number in [0, 1], got {alpha!r}")
        if not reference:
            raise ParameterError("controlled acceptance needs a reference continuation per sequence")
        self.reference, self.alpha, self.vocab = reference, float(alpha), vocab
        self.rng = np.random.default_rng(seed)

    def draw(self, i: int, emitted: int, gamma: int) -> tuple[list[int], int]:
        """Sequence i, ``emitted`` decode tokens so far: its γ proposals and how many of them the target keeps."""
        ref = self.reference[i]
        if emitted + gamma >= len(ref):
            raise ParameterError(
                f"the reference of sequence {i} ({len(ref)} tokens) is too short for {emitted} + {gamma}"
            )
        keep = self.rng.random(gamma) < self.alpha
        proposals = [ref[emitted + j] if keep[j] else (ref[emitted + j] + 1) % self.vocab for j in range(gamma)]
        k = int(np.argmin(keep)) if not keep.all() else gamma
        return proposals, k

    def next_tokens(self, i: int, emitted: int, k: int) -> list[int]:
        """The tokens a round that kept k drafts adds: the k kept proposals and the target's own token after them."""
        return self.reference[i][emitted : emitted + k + 1]
