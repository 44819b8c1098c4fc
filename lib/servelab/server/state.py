"""What the request handlers share: the settings, the engine (``EngineLoop`` or ``EngineProcess``), the
tokenizer and the metrics; and the checks that turn a request body into engine inputs (400 on bad ones)."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.server.engine_loop import EngineLoop
from servelab.server.engine_process import EngineProcess
from servelab.server.errors import APIError
from servelab.server.generation import Mailbox
from servelab.server.metrics import ServerMetrics
from servelab.server.protocol import MAX_N, SamplingFields
from servelab.server.tokenizer import TextCodec

SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class ServerSettings:
    model_name: str  # what /v1/models lists and requests may name
    api_key: str | None = None  # Bearer token required on /v1/* when set
    max_body_bytes: int = 1 << 20  # larger bodies: 413
    max_waiting: int | None = 4096  # requests waiting to be scheduled; beyond: 429
    retry_after_s: int = 1  # the Retry-After of a 429
    drain_timeout_s: float = 120.0  # at shutdown, running requests get this long to finish


class ServerState:
    """What the handlers share: the engine (an ``EngineLoop`` thread here, or an ``EngineProcess``), the
    tokenizer, settings and metrics."""

    def __init__(
        self, loop: EngineLoop | EngineProcess, codec: TextCodec, settings: ServerSettings, metrics: ServerMetrics
    ):
        self.loop, self.codec, self.settings, self.metrics = loop, codec, settings, metrics
        self.vocab = loop.vocab
        self.max_model_len = loop.max_model_len
        self.mailbox: Mailbox | None = None  # set when the app's event loop starts

    # ---- request → engine inputs -------------------------------------------------------------------
    def prompt_ids(self, prompt) -> list[list[int]]:
        """The prompts of a completion request as token-id lists (text is encoded); 400 on bad ones."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise APIError(400, "prompt is empty", param="prompt", code="empty_prompt")
        out = []
        for p in prompts:
            ids = self.codec.encode(p) if isinstance(p, str) else list(p)
            if not ids:
                raise APIError(400, "prompt is empty", param="prompt", code="empty_prompt")
            self.check_ids(ids)
            out.append(ids)
        return out

    def check_token_range(self, ids: list[int], param: str = "prompt") -> None:
        bad = [t for t in ids if t < 0 or t >= self.vocab]
        if bad:
            raise APIError(
                400,
                f"{param} token ids must be in [0, {self.vocab}); got {bad[0]}",
                param=param,
                code="token_id_out_of_range",
            )

    def check_ids(self, ids: list[int]) -> None:
        self.check_token_range(ids)
        if len(ids) >= self.max_model_len:
            raise APIError(
                400,
                f"prompt has {len(ids)} tokens; this model's context is {self.max_model_len} "
                f"tokens, which must also hold at least one output token",
                param="prompt",
                code="context_length_exceeded",
            )

    def sampling_params(
        self,
        req: SamplingFields,
        prompt_len: int,
        max_tokens: int | None,
        *,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        seed_offset: int = 0,
    ) -> SamplingParams:
        """The engine's settings for one choice. ``seed_offset``: choice j of ``n`` samples with ``seed + j`` (as
        vLLM does), so the choices differ and each is reproducible. ``max_tokens`` 0 (a scoring request) runs one
        token, which the response drops."""
        if max_tokens == 0:
            max_tokens = 1
        if max_tokens is None:
            max_tokens = self.max_model_len - prompt_len
        if prompt_len + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds this model's "
                f"context of {self.max_model_len} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1] - MAX_N:
            raise APIError(400, f"seed must be a 64-bit signed integer, got {req.seed}", param="seed")
        try:
            bias = req.logit_bias_pairs()
        except ValueError as e:
            raise APIError(400, str(e), param="logit_bias") from None
        self.check_token_range([t for t, _ in bias], "logit_bias")
        self.check_token_range(list(req.stop_token_ids or ()), "stop_token_ids")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=None if req.seed is None else req.seed + seed_offset,
                stop_token_ids=tuple(req.stop_token_ids or ()),
                ignore_eos=req.ignore_eos,
                top_k=req.top_k or 0,
                min_p=req.min_p,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty,
                logit_bias=bias,
                min_tokens=req.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
            )
        except ParameterError as e:
            param = str(e).split(" ", 1)[0]
            raise APIError(400, str(e), param=param if param in type(req).model_fields else None) from None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.model_name:
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.settings.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def check_common(self, req: SamplingFields) -> None:
        self.check_model(req.model)
        for param, why in req.unsupported():
            raise APIError(400, why, param=param, code="unsupported")
        if any(not s for s in req.stop_strings()):
            raise APIError(400, "stop strings must be non-empty", param="stop")
