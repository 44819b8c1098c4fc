"""Which speculation the server runs, from its flags: a draft model or prompt lookup, and γ.

This project's spelling: ``--draft-model SPEC`` (or ``--draft-model prompt-lookup``) with
``--num-speculative-tokens N``. vLLM's: ``--speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_max": 3, "prompt_lookup_min": 1}'``, or ``'{"model": SPEC, "num_speculative_tokens": 4}'`` for a
draft model. Both become one ``SpeculativeConfig``; bad settings raise ``ParameterError`` before a model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from servelab.errors import ParameterError

PROMPT_LOOKUP = "prompt-lookup"  # the --draft-model value that means no draft model: drafts copied from the context
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
_METHODS = ("ngram", "draft_model")
VLLM_NGRAM = 5  # vLLM's prompt_lookup_min and _max where the JSON gives neither


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" (prompt lookup) or "draft_model"
    num_speculative_tokens: int  # γ
    model: str | None = None  # the draft model's spec (draft_model only)
    prompt_lookup_max: int = 3  # n-gram lengths searched, longest first (ngram only; --draft-model prompt-lookup:
    prompt_lookup_min: int = 1  # PromptLookupProposer's defaults)

    def proposer(self):
        """The prompt-lookup proposer this config describes (ngram only)."""
        from servelab.speculative.prompt_lookup import PromptLookupProposer

        return PromptLookupProposer(max_ngram=self.prompt_lookup_max, min_ngram=self.prompt_lookup_min)


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ParameterError(f"speculative config: {name} must be a positive integer, got {v!r}")
    return v


def _from_json(text: str, num_speculative_tokens: int) -> SpeculativeConfig:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParameterError(f"--speculative-config is not JSON ({e.msg}): {text!r}") from None
    if not isinstance(d, dict):
        raise ParameterError(f"--speculative-config must be a JSON object, got {text!r}")
    if unknown := sorted(set(d) - _KEYS):
        raise ParameterError(f"--speculative-config: unknown keys {unknown}; this server takes {sorted(_KEYS)}")
    method = d.get("method") or ("draft_model" if d.get("model") else None)
    if method not in _METHODS:
        raise ParameterError(f"--speculative-config: method must be one of {list(_METHODS)}, got {method!r}")
    if method == "draft_model" and (not isinstance(d.get("model"), str) or d["model"] == PROMPT_LOOKUP):
        raise ParameterError('--speculative-config: a draft model needs "model": a model spec')
    gamma = _positive("num_speculative_tokens", d.get("num_speculative_tokens", num_speculative_tokens))
    if method == "draft_model":
        return SpeculativeConfig(method, gamma, model=d["model"])
    # vLLM's defaults, so that one JSON means one thing on both servers: neither bound given, 5 and 5; one, both
    lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
    lo, hi = (
        (VLLM_NGRAM, VLLM_NGRAM) if lo is None and hi is None else (hi if lo is None else lo, lo if hi is None else hi)
    )
    lo, hi = _positive("prompt_lookup_min", lo), _positive("prompt_lookup_max", hi)
    if lo > hi:
        raise ParameterError(f"--speculative-config: prompt_lookup_min ({lo}) exceeds prompt_lookup_max ({hi})")
    return SpeculativeConfig(method, gamma, prompt_lookup_max=hi, prompt_lookup_min=lo)


def speculative_config(
    draft_model: str | None, num_speculative_tokens: int, speculative_json: str | None = None
) -> SpeculativeConfig | None:
    """The flags' speculation, or None for plain decoding."""
    if draft_model and speculative_json:
        raise ParameterError("give --draft-model or --speculative-config, not both")
    if speculative_json:
        return _from_json(speculative_json, num_speculative_tokens)
    if not draft_model:
        return None
    gamma = _positive("num_speculative_tokens", num_speculative_tokens)
    if draft_model == PROMPT_LOOKUP:
        return SpeculativeConfig("ngram", gamma)
    return SpeculativeConfig("draft_model", gamma, model=draft_model)
