"""The wire format: OpenAI's request and response bodies as pydantic models.

Requests are parsed without type coercion (``"5"`` is not an integer), so a wrong type is a 400; every request
error is a 400 ``invalid_request_error`` (we never answer 422); ``param`` names the offending field. A field this
server does not know is ignored and logged once per field name (``unknown_fields``; vLLM does the same), so
clients that send more than OpenAI's fields (lm-eval, Qwen's ``extra_body``, agent frameworks) work.

OpenAI's sampling fields are all honoured: ``n`` (the choices share the prompt's KV blocks through the prefix
cache when it is on), ``logprobs``/``top_logprobs`` (of the model's raw distribution), ``echo`` (with the prompt's
logprobs), ``presence_penalty``/``frequency_penalty``, ``logit_bias``, ``seed``. Extensions beyond OpenAI's API,
spelt as vLLM spells them: ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos`` (keep
generating past the end-of-sequence token), ``stop_token_ids`` (stop at any of these token ids), and
``return_token_ids`` (the generated ``token_ids`` in each choice and stream chunk).

Refused with a 400 naming the field: ``suffix``, ``best_of`` other than ``n``, and a ``response_format`` asking
for JSON (structured output is not implemented; ``{"type": "text"}`` is accepted).
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TokenIds = list[int]
Prompt = str | TokenIds | list[str] | list[TokenIds]
MAX_N = 128  # choices per request: each is an engine request, so a huge n is one client filling the queue
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit (and vLLM's default --max-logprobs)


class StrictModel(BaseModel):
    """No type coercion; unknown fields are kept aside (``model_extra``) to be logged and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the fields in ``model`` (and the models and lists of models it holds) that no schema
    declares; e.g. ``["guided_json", "messages.tool_calls"]``."""
    out = [prefix + k for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        # a list is walked only where it holds models (a list field holds one type): a prompt of 2,112 token ids
        # took 150 µs of each request's 0.26 ms parse in isinstance checks, in a burst of 256 requests that the
        # server takes in one after another before it writes any first token
        if isinstance(value, list):
            nested = value if value and isinstance(value[0], BaseModel) else []
        else:
            nested = [value] if isinstance(value, BaseModel) else []
        for v in nested:
            out += [f for f in unknown_fields(v, f"{prefix}{name}.") if f not in out]
    return out


class StreamOptions(StrictModel):
    include_usage: bool = False


class ResponseFormat(StrictModel):
    type: str = "text"


class SamplingFields(StrictModel):
    """The fields completions and chat completions share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # extensions (vLLM's names)
    top_k: int | None = Field(None, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    return_token_ids: bool = False

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, bias) pairs; ``ValueError`` on a key that is not a token id."""
        out = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers as strings), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
            out.append((int(key), float(bias)))
        return tuple(out)

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for every setting this server cannot honour."""
        out = []
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "stream_options is only allowed with stream=true"))
        if self.response_format is not None and self.response_format.type != "text":
            out.append(
                (
                    "response_format",
                    f"response_format {self.response_format.type!r} (structured output) is not supported; "
                    "only {'type': 'text'} is",
                )
            )
        return out


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for completions; 0 only with echo (scoring)
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.best_of is not None and self.best_of != self.n:
            out.append(("best_of", "best_of must equal n (no ranking of extra candidates)"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        if self.max_tokens == 0 and not self.echo:
            out.append(("max_tokens", "max_tokens=0 is allowed only with echo=true (scoring the prompt)"))
        return out


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.top_logprobs and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs=true"))
        return out

    @property
    def num_logprobs(self) -> int | None:
        """How many top tokens each position reports (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(StrictModel):
    """vLLM's ``POST /tokenize``: a ``prompt`` (completion form) or ``messages`` (chat form)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(StrictModel):
    """vLLM's ``POST /detokenize``."""

    model: str | None = None
    tokens: TokenIds


# ---- responses (plain dicts: they are built per token, so no validation on the hot path) ----------


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    """OpenAI's ``created``: Unix seconds."""
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
