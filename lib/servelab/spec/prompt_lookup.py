"""Prompt lookup: drafts copied from the context itself, with no draft model (Saxena 2023; HF's
``prompt_lookup_num_tokens``).

The last n tokens of the context (n from ``max_ngram`` down to ``min_ngram``) are searched for earlier in the
context; where they occurred, the tokens that followed them there are the proposal. Answers that repeat their
prompt (code edits, extraction, summaries) are drafted for free; elsewhere nothing is proposed and a round is a
plain decode step. The draft costs host time only (a search over the context), so its cost ratio c is ≈ 0.
"""

from __future__ import annotations

from servelab.engine.sequence import SamplingParams
from servelab.errors import ParameterError
from servelab.spec.proposer import Proposal


class PromptLookupProposer:
    """``lookup(context, gamma)``: up to ``gamma`` tokens that followed the most recent earlier occurrence of the
    context's longest matching suffix (``max_ngram`` … ``min_ngram`` tokens); [] where none occurs.

    The most recent occurrence is taken (HF takes the first): in a generated answer the latest repetition is the
    likeliest to continue. ``propose`` has the draft proposers' signature but reads the whole ``context`` (it
    holds no cache, so it has nothing to roll back)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        for name, v in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name} must be a positive int, got {v!r}")
        if min_ngram > max_ngram:
            raise ParameterError(f"min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def lookup(self, context: list[int], gamma: int) -> list[int]:
        if gamma < 1:
            raise ParameterError(f"gamma must be >= 1, got {gamma}")
        n_ctx = len(context)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            suffix = context[n_ctx - n :]
            # latest start first; a match must end before the suffix itself so that something follows it
            for start in range(n_ctx - n - 1, -1, -1):
                if context[start : start + n] == suffix:
                    return list(context[start + n : start + n + gamma])
        return []

    def propose(self, context: list[int], gamma: int, params: SamplingParams | None = None, generator=None) -> Proposal:
        """Greedy only: a copied token has no distribution q to run the rejection rule with."""
        if params is not None and not params.greedy:
            raise ParameterError("prompt lookup proposes without a distribution: use greedy decoding")
        return Proposal(self.lookup(context, gamma), None)
