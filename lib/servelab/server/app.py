"""The FastAPI app: OpenAI's endpoints (``routes_openai.py``), vLLM's operational ones (``routes_ops.py``),
OpenAI-shaped errors (``errors.py``), and the engine's lifecycle.

    app = create_app(engine, codec, ServerSettings(model_name="tiny"))

The app owns an ``EngineLoop`` (or a launched ``EngineProcess``): started in the lifespan, drained at its
end. Handlers parse the body themselves (size limit, strict pydantic parsing) so that every bad request
answers in OpenAI's error shape with status 400/413, never FastAPI's 422.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from servelab.engine import Engine
from servelab.server import routes_openai, routes_ops
from servelab.server.engine_loop import EngineLoop
from servelab.server.engine_process import EngineProcess
from servelab.server.errors import install_handlers
from servelab.server.generation import Mailbox
from servelab.server.metrics import ServerMetrics
from servelab.server.state import ServerSettings, ServerState
from servelab.server.step_log import StepLog
from servelab.server.tokenizer import TextCodec

__all__ = ["ServerSettings", "ServerState", "create_app"]


def engine_backend(
    engine: Engine | EngineLoop | EngineProcess,
    settings: ServerSettings,
    metrics: ServerMetrics | None,
    step_log: StepLog | None,
) -> tuple[EngineLoop | EngineProcess, ServerMetrics]:
    """The loop that steps ``engine`` (an ``EngineLoop`` made here around a bare engine), and the one metrics
    registry both sides fill (the loop's own if it has one)."""
    metrics = metrics or ServerMetrics(settings.model_name)
    if not isinstance(engine, (EngineLoop, EngineProcess)):
        return EngineLoop(engine, max_waiting=settings.max_waiting, metrics=metrics, step_log=step_log), metrics
    if engine.metrics is None:
        engine.use_metrics(metrics)
        return engine, metrics
    return engine, engine.metrics


def lifespan_of(state: ServerState):
    """Start the engine loop with the app's event loop; at shutdown, let running requests finish (up to
    ``drain_timeout_s``; a second signal stops them at once: ``serve.py``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.mailbox = Mailbox(asyncio.get_running_loop())
        state.loop.start()
        yield
        await asyncio.to_thread(state.loop.drain, state.settings.drain_timeout_s)

    return lifespan


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
    loop, metrics = engine_backend(engine, settings, metrics, step_log)
    state = ServerState(loop, codec, settings, metrics)
    app = FastAPI(title="servelab", lifespan=lifespan_of(state), docs_url=None, redoc_url=None)
    app.state.server = state
    install_handlers(app, on_error=lambda status: metrics.rejected.labels(status=str(status)).inc())
    app.include_router(routes_ops.router)
    app.include_router(routes_openai.router)
    return app
