"""The wire format: OpenAI's request and response bodies as pydantic models.

Requests are parsed strictly (``extra="forbid"``, no type coercion: ``"5"`` is not an integer), so a
typo in a field name or a wrong type is a 400 rather than a silently ignored setting. Every request
error is a 400 ``invalid_request_error`` (we never answer 422); ``param`` names the offending field.

Extensions beyond OpenAI's API (vLLM spells them the same way):

- ``ignore_eos``: keep generating past the end-of-sequence token (benchmarks, load generators);
- ``stop_token_ids``: stop at any of these token ids (in addition to ``stop`` strings);
- ``return_token_ids``: put the generated ``token_ids`` in each choice (and in each stream chunk), so
  a client can compare outputs token for token.

OpenAI fields that the server does not implement are accepted only at their neutral value (e.g.
``logprobs: null``, ``n: 1``, ``echo: false``) and rejected with a 400 naming them otherwise.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TokenIds = list[int]
Prompt = str | TokenIds | list[str] | list[TokenIds]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(StrictModel):
    include_usage: bool = False


class SamplingFields(StrictModel):
    """The fields completions and chat completions share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted at their neutral value only (see ``unsupported``)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # extensions
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    return_token_ids: bool = False

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for every setting this server cannot honour."""
        out = []
        if self.n != 1:
            out.append(("n", "only n=1 is supported"))
        if self.presence_penalty or self.frequency_penalty:
            out.append(
                (
                    "presence_penalty" if self.presence_penalty else "frequency_penalty",
                    "presence/frequency penalties are not supported",
                )
            )
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "stream_options is only allowed with stream=true"))
        return out


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs is not None:
            out.append(("logprobs", "logprobs are not supported"))
        if self.echo:
            out.append(("echo", "echo is not supported"))
        if self.best_of not in (None, 1):
            out.append(("best_of", "only best_of=1 is supported"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        return out


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs or self.top_logprobs is not None:
            out.append(("logprobs", "logprobs are not supported"))
        return out


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
