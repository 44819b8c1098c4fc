"""The FastAPI app: OpenAI's completions and chat completions, models, health and Prometheus metrics.

    app = create_app(engine, codec, ServerSettings(model_name="tiny"))

The app owns an ``EngineLoop`` (started in the lifespan, drained at its end). Handlers parse the body
themselves (size limit, strict pydantic parsing) so that every bad request answers in OpenAI's error
shape with status 400/413, never FastAPI's 422.
"""

from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from servelab.engine import Engine, SamplingParams
from servelab.errors import ParameterError
from servelab.server.engine_loop import EngineLoop
from servelab.server.engine_process import EngineProcess
from servelab.server.errors import APIError, from_validation_error, install_handlers
from servelab.server.generation import Generation, GenerationFailed, Mailbox
from servelab.server.metrics import ServerMetrics
from servelab.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields, now_s
from servelab.server.responses import DONE, ResponseFormat
from servelab.server.step_log import StepLog
from servelab.server.tokenizer import NoChatTemplate, TextCodec

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

    def check_ids(self, ids: list[int]) -> None:
        bad = [t for t in ids if t < 0 or t >= self.vocab]
        if bad:
            raise APIError(
                400,
                f"prompt token ids must be in [0, {self.vocab}); got {bad[0]}",
                param="prompt",
                code="token_id_out_of_range",
            )
        if len(ids) >= self.max_model_len:
            raise APIError(
                400,
                f"prompt has {len(ids)} tokens; this model's context is {self.max_model_len} "
                f"tokens, which must also hold at least one output token",
                param="prompt",
                code="context_length_exceeded",
            )

    def sampling_params(self, req: SamplingFields, prompt_len: int, max_tokens: int | None) -> SamplingParams:
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
        if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]:
            raise APIError(400, f"seed must be a 64-bit signed integer, got {req.seed}", param="seed")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=req.seed,
                stop_token_ids=tuple(req.stop_token_ids or ()),
                ignore_eos=req.ignore_eos,
            )
        except ParameterError as e:
            raise APIError(400, str(e)) from None

    def check_common(self, req: SamplingFields) -> None:
        if req.model is not None and req.model != self.settings.model_name:
            raise APIError(
                404,
                f"the model {req.model!r} does not exist; this server serves {self.settings.model_name!r}",
                param="model",
                code="model_not_found",
            )
        for param, why in req.unsupported():
            raise APIError(400, why, param=param, code="unsupported")
        if any(not s for s in req.stop_strings()):
            raise APIError(400, "stop strings must be non-empty", param="stop")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one larger than ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"request body of {declared} bytes exceeds the limit of {limit} bytes", code="body_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse(request: Request, model_cls, limit: int):
    body = await read_body(request, limit)
    try:
        return model_cls.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


async def until_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class GenerationStream(StreamingResponse):
    """An SSE response whose generation is aborted however the response ends (finished, client gone,
    server cancelled) — a never-started body iterator would otherwise leak its engine requests."""

    def __init__(self, generation: Generation, content, on_abort=None, **kw):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            **kw,
        )
        self.generation = generation
        self.on_abort = on_abort

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.generation.finished and self.on_abort is not None:
                self.on_abort(sum(not c.finished for c in self.generation.choices))
            self.generation.cancel()


def create_app(
    engine: Engine | EngineLoop | EngineProcess,
    codec: TextCodec,
    settings: ServerSettings,
    *,
    metrics: ServerMetrics | None = None,
    step_log: StepLog | None = None,
) -> FastAPI:
    """The app serving ``engine``: anything that steps like an ``Engine`` (the engine, or a speculative one;
    stepped by an ``EngineLoop`` thread made here, with ``settings.max_waiting`` and ``step_log``), or a ready
    ``EngineLoop``/``EngineProcess`` built with ``metrics``."""
    metrics = metrics or ServerMetrics(settings.model_name)
    if not isinstance(engine, (EngineLoop, EngineProcess)):
        engine = EngineLoop(engine, max_waiting=settings.max_waiting, metrics=metrics, step_log=step_log)
    elif engine.metrics is None:
        engine.use_metrics(metrics)
    else:
        metrics = engine.metrics  # one registry: the one the engine side already fills
    state = ServerState(engine, codec, settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.mailbox = Mailbox(asyncio.get_running_loop())
        state.loop.start()
        yield
        await asyncio.to_thread(state.loop.drain, settings.drain_timeout_s)

    app = FastAPI(title="servelab", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_handlers(app, on_error=lambda status: metrics.rejected.labels(status=str(status)).inc())

    async def require_api_key(request: Request) -> None:
        if not settings.api_key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise APIError(
                401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
            )

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

    @app.get("/health")
    async def health():
        if state.loop.draining or not state.loop.alive:
            return JSONResponse({"status": "draining" if state.loop.draining else "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @v1.get("/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.model_name,
                    "object": "model",
                    "created": now_s(),
                    "owned_by": "servelab",
                    "max_model_len": state.max_model_len,
                }
            ],
        }

    async def respond(request: Request, gen: Generation, req: SamplingFields, chat: bool):
        fmt = ResponseFormat(
            settings.model_name,
            chat=chat,
            return_token_ids=req.return_token_ids,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
        )

        def count(batch) -> None:
            for ev in batch:
                if ev.finish_reason is not None:
                    metrics.finished.labels(finish_reason=ev.finish_reason).inc()

        if req.stream:

            async def chunks():
                if chat:
                    yield "".join(fmt.role_chunk(c.index) for c in gen.choices)
                try:
                    async for batch in gen.events():
                        count(batch)
                        yield "".join(fmt.chunk(ev) for ev in batch)  # one write, one SSE event per token
                except GenerationFailed as e:
                    yield fmt.error_event(APIError(500, str(e)).body())
                if fmt.include_usage:
                    yield fmt.usage_chunk(gen)
                yield DONE

            return GenerationStream(
                gen, chunks(), on_abort=lambda n: metrics.finished.labels(finish_reason="abort").inc(n)
            )

        # not streaming: collect, aborting if the client goes away meanwhile
        async def collect():
            async for batch in gen.events():
                count(batch)

        collector, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(until_disconnect(request))
        try:
            await asyncio.wait({collector, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collector.done():
                collector.cancel()
                gen.cancel()
                metrics.finished.labels(finish_reason="abort").inc(sum(not c.finished for c in gen.choices))
        if not collector.done() or collector.cancelled():
            return Response(status_code=499)  # client closed the request; nobody reads this
        try:
            collector.result()
        except GenerationFailed as e:
            raise APIError(500, str(e)) from None
        return fmt.body(gen)

    @v1.post("/completions")
    async def completions(request: Request):
        req = await parse(request, CompletionRequest, settings.max_body_bytes)
        state.check_common(req)
        prompts = state.prompt_ids(req.prompt)
        params = [state.sampling_params(req, len(p), req.max_tokens) for p in prompts]
        gen = Generation(
            state.loop,
            codec,
            prompts,
            params,
            req.stop_strings(),
            retry_after_s=settings.retry_after_s,
            mailbox=state.mailbox,
        )
        await gen.start()
        return await respond(request, gen, req, chat=False)

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        req = await parse(request, ChatCompletionRequest, settings.max_body_bytes)
        state.check_common(req)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = codec.chat_prompt(messages)
        except NoChatTemplate as e:
            raise APIError(400, str(e), param="messages", code="no_chat_template") from None
        if not ids:
            raise APIError(400, "the chat template produced an empty prompt", param="messages")
        state.check_ids(ids)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = [state.sampling_params(req, len(ids), max_tokens)]
        gen = Generation(
            state.loop,
            codec,
            [ids],
            params,
            req.stop_strings(),
            retry_after_s=settings.retry_after_s,
            mailbox=state.mailbox,
        )
        await gen.start()
        return await respond(request, gen, req, chat=True)

    app.include_router(v1)
    return app
