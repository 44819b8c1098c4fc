"""What the load generator asks a server before a run: its context length and, for text prompts, their lengths.

- ``model_card`` / ``card_max_model_len``: the model's entry in ``GET /v1/models``, and the ``max_model_len``
  that vLLM (and the servelab server) report on it;
- ``count_tokens``: text prompts' lengths in tokens from ``POST /tokenize`` (vLLM's endpoint: ``{"prompt"}`` in,
  ``{"count"}`` out).

A server that predates either answers without it: the functions then return None and the caller falls back
(a ``--max-model-len`` flag, or ``prompt_tokens`` in the dataset). Plain ``urllib``: these are a few requests
before the run, not part of what is measured.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def _call(url: str, body: dict | None = None, api_key: str | None = None, timeout_s: float = 10.0):
    """The JSON answer of a GET (``body`` None) or POST to ``url``; None when the server has no such endpoint,
    is unreachable or answers something that is not JSON."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def model_card(base_url: str, model: str | None = None, api_key: str | None = None) -> dict | None:
    """The ``/v1/models`` entry whose ``id`` is ``model`` (the first entry when None); None if there is none."""
    listing = _call(base_url.rstrip("/") + "/v1/models", api_key=api_key)
    cards = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(cards, list):
        return None
    return next((c for c in cards if isinstance(c, dict) and (model is None or c.get("id") == model)), None)


def card_max_model_len(card: dict | None) -> int | None:
    """The context length (tokens: prompt + output) a model card reports, or None when it reports none."""
    v = card.get("max_model_len") if isinstance(card, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def count_tokens(
    base_url: str, prompts: list[str], model: str | None = None, api_key: str | None = None
) -> list[int] | None:
    """Each text prompt's length in tokens as the server's tokenizer counts it (``/tokenize``), or None when
    the server cannot say (no such endpoint)."""
    url = base_url.rstrip("/") + "/tokenize"
    counts = []
    for text in prompts:
        body = {"prompt": text} | ({"model": model} if model else {})
        answer = _call(url, body, api_key)
        n = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(n, int) or isinstance(n, bool):
            return None
        counts.append(n)
    return counts
