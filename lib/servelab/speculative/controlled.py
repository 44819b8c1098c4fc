"""Controlled acceptance for the engine's speculative mode: drafts whose acceptance rate is set, not learned.

Acceptance needs trained weights; cost needs only the shapes. To measure the cost side at the seed's shapes with
random weights, the draft runs every step as usual (every cost in the step is real), and then each proposal is
overridden: with probability α it is the target's own greedy token at that position (from a reference continuation
the plain engine computed first), otherwise a token the target rejects (the reference token + 1, mod the
vocabulary). Every draw is independent, which is the assumption of Leviathan et al.'s formula, so a greedy step
keeps k drafts with P(k) = α^k (1 − α) for k < γ and α^γ at k = γ.

The draws also decide what the step keeps: the verify step runs in full, and then its request gets the reference's
tokens for the kept run and the one after it (``emitted``). In float32 that is what the
target chose anyway (the CPU tests check it: ``disagreed`` stays 0). In bf16 the verify step's logits round
differently from the plain engine's, and at random weights the top two are often within rounding: left to itself
the target leaves the reference at the first near-tie, after which every "right" proposal is wrong. On the H100 that
made α = 0.8 keep 34% of drafts at batch 1 and 3% at batch 8.

    engine.override = ControlledDrafts(reference, alpha=0.8, vocab=engine.model.shape.vocab)
"""

from __future__ import annotations

import numpy as np

from servelab.errors import ParameterError


class ControlledDrafts:
    """``reference[seq_id]``: that request's greedy output tokens, at least as long as its ``max_tokens`` (a draft
    never reaches past the request's last token)."""

    def __init__(self, reference: dict[int, list[int]], alpha: float, vocab: int, seed: int = 0):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ParameterError(f"alpha must be a number in [0, 1], got {alpha!r}")
        self.reference, self.alpha, self.vocab = reference, float(alpha), vocab
        self.rng = np.random.default_rng(seed)
        self._emit: dict[int, list[int]] = {}  # seq_id -> the tokens this step's verification gives it
        self.disagreed = 0  # verifications where the target, left alone, would have emitted something else

    def __call__(self, seqs, drafts: list[list[int]]) -> list[list[int]]:
        """Each sequence's drafts replaced, as many as it proposed (a sequence's last output token is the pending one
        the step computes; its drafts continue after it)."""
        out = []
        for seq, d in zip(seqs, drafts, strict=True):
            if not seq.params.greedy:
                raise ParameterError("controlled acceptance rewrites greedy requests' drafts only")
            ref = self.reference.get(seq.seq_id)
            if ref is None:
                raise ParameterError(f"no reference continuation for sequence {seq.seq_id}")
            at = len(seq.output_token_ids)
            if at + len(d) > len(ref):
                raise ParameterError(
                    f"the reference of sequence {seq.seq_id} ({len(ref)} tokens) ends before {at + len(d)}"
                )
            keep = self.rng.random(len(d)) < self.alpha
            out.append([ref[at + j] if keep[j] else (ref[at + j] + 1) % self.vocab for j in range(len(d))])
            if d:  # a request without drafts takes a plain step: no verification asks for its tokens
                kept = int(np.argmin(keep)) if not keep.all() else len(d)
                self._emit[seq.seq_id] = ref[at : at + kept + 1]  # the kept run, then the target's token after it
        return out

    def emitted(self, seq, target: list[int]) -> list[int]:
        """What ``seq``'s verification emits: the reference's tokens for the run the draws kept and the one after it;
        ``target``, what the target's own verification emitted, only counted when it differs."""
        out = self._emit.pop(seq.seq_id)
        self.disagreed += out != target
        return out
