"""Prompt lookup: drafts copied from the context itself, with no draft model (Saxena 2023; HF's
``prompt_lookup_num_tokens``; vLLM's ``"method": "ngram"``).

The last n tokens of the context (n from ``max_ngram`` down to ``min_ngram``) are searched for earlier in the
context; where they occurred, the token that followed them there is the next draft. Answers that repeat their
prompt (code edits, extraction, summaries) are drafted for free; elsewhere nothing is proposed and a round is a
plain decode step. The draft costs host time only (a search over the context), so its cost ratio c is ≈ 0.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from servelab.errors import ParameterError


class PromptLookupProposer:
    """``lookup(context, gamma)``: up to ``gamma`` drafts, each the token that followed the most recent earlier
    occurrence of the context's longest matching suffix (``max_ngram`` … ``min_ngram`` tokens), the context
    extended by the drafts before it; the drafts stop where no suffix occurs earlier ([] if the first has none).

    The most recent occurrence is taken (HF takes the first): in a generated answer the latest repetition is the
    likeliest to continue. Drafting token by token, as a draft model does, rather than copying the span after
    one match (HF, vLLM) keeps going past the end of the context (a repeating pattern is drafted to γ), and makes
    draft i exactly the first-token lookup on the target's own prefix whenever drafts 1 … i − 1 were kept, so the
    engine keeps what ``studies.s03_speculative.real_acceptance.lookup_agreement`` counts. The two differ only
    when a longest match of ``max_ngram`` tokens, shifted by one, occurs again later."""

    lm = None  # no draft model: no cache to prefill or roll back

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
        ids = np.empty(n_ctx + gamma, dtype=np.int64)  # the context, then the drafts as they are found
        ids[:n_ctx] = context
        out: list[int] = []
        for _ in range(gamma):
            tok = self._next(ids[: n_ctx + len(out)])
            if tok is None:
                break
            ids[n_ctx + len(out)] = tok
            out.append(tok)
        return out

    def _next(self, ids: np.ndarray) -> int | None:
        """The token after the latest earlier occurrence of the longest matching suffix of ``ids``, or None."""
        n_ctx = len(ids)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            # windows starting at 0 … n_ctx - n - 1: each ends before the suffix itself, so a token follows it
            windows = sliding_window_view(ids[: n_ctx - 1], n)
            starts = np.flatnonzero((windows == ids[n_ctx - n :]).all(axis=1))
            if starts.size:
                return int(ids[starts[-1] + n])
        return None
