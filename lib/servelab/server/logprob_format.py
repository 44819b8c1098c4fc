"""Logprobs in OpenAI's two shapes, from the engine's ``TokenLogprob``s.

- completions (the legacy shape, which lm-eval reads): ``{"tokens", "token_logprobs", "top_logprobs",
  "text_offset"}``, one entry per token; ``top_logprobs`` maps token text to logprob for the ``logprobs`` most
  likely tokens plus the chosen one (vLLM's rule); with ``echo`` the prompt's tokens come first, the first of
  them with ``None`` (nothing precedes it to score it);
- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``, with
  exactly ``top_logprobs`` alternatives.

A token's text is the tokenizer's decoding of that token alone. ``-inf`` (a token a processor ruled out has
finite raw logprob, but a model can give ``-inf``) is written as -9999.0, as vLLM does, since JSON has no inf.
"""

from __future__ import annotations

import math

FLOOR = -9999.0


def finite(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


class TokenTexts:
    """Each token id's text under ``codec``, decoded once per response."""

    def __init__(self, codec):
        self.codec = codec
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.codec.decode([token_id])
        return text


def completion_logprobs(token_ids: list[int], entries: list, k: int, texts: TokenTexts, offset: int = 0) -> dict:
    """The completions shape for ``token_ids`` and their ``entries`` (a ``TokenLogprob`` or None each); text
    offsets start at ``offset``."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, e in zip(token_ids, entries, strict=True):
        text = texts(tok)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if e is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        lp = finite(e.logprob)
        out["token_logprobs"].append(lp)
        top = {texts(t): finite(v) for t, v in e.top[:k]}
        top.setdefault(text, lp)
        out["top_logprobs"].append(top)
    return out


def chat_logprob_entries(entries: list, k: int, texts: TokenTexts) -> list[dict]:
    """The chat shape's ``content`` list for ``entries`` (``TokenLogprob``s)."""

    def one(token_id: int, lp: float) -> dict:
        text = texts(token_id)
        return {"token": text, "logprob": finite(lp), "bytes": list(text.encode("utf-8"))}

    return [one(e.token_id, e.logprob) | {"top_logprobs": [one(t, v) for t, v in e.top[:k]]} for e in entries]
