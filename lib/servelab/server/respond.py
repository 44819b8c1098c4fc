"""Answering with a generation: a server-sent-event stream, or one JSON body once it has finished.

Either way the generation is aborted when the response ends early (client gone, server cancelled), so
its engine requests free their KV blocks, and each choice's end is counted once in the metrics.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from servelab.server.errors import APIError
from servelab.server.generation import Generation, GenerationFailed
from servelab.server.metrics import ServerMetrics
from servelab.server.protocol import SamplingFields
from servelab.server.request_body import until_disconnect
from servelab.server.responses import DONE, ResponseFormat


class GenerationStream(StreamingResponse):
    """An SSE response whose generation is aborted however the response ends (finished, client gone,
    server cancelled) — a never-started body iterator would otherwise leak its engine requests."""

    def __init__(self, generation: Generation, content, metrics: ServerMetrics, **kw):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            **kw,
        )
        self.generation = generation
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            count_aborted(self.generation, self.metrics)
            self.generation.cancel()


def count_aborted(gen: Generation, metrics: ServerMetrics) -> None:
    """The choices that had not finished when their response ended count as aborted."""
    open_choices = sum(not c.finished for c in gen.choices)
    if open_choices:
        metrics.count_finished("abort", open_choices)


def count_finished(batch, metrics: ServerMetrics) -> None:
    for ev in batch:
        if ev.finish_reason is not None:
            metrics.count_finished(ev.finish_reason)


async def respond(
    request: Request,
    gen: Generation,
    req: SamplingFields,
    *,
    chat: bool,
    model_name: str,
    metrics,
    logprobs: int | None = None,
    texts=None,
    echo: list[str] | None = None,
):
    """The response to a started generation: streamed if the request asked so, else one body. ``logprobs``,
    ``texts`` and ``echo``: as ``ResponseFormat`` takes them."""
    fmt = ResponseFormat(
        model_name,
        chat=chat,
        return_token_ids=req.return_token_ids,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=logprobs,
        texts=texts,
        echo=echo,
    )
    if req.stream:
        return GenerationStream(gen, sse_chunks(gen, fmt, metrics), metrics)
    return await whole_body(request, gen, fmt, metrics)


async def sse_chunks(gen: Generation, fmt: ResponseFormat, metrics: ServerMetrics):
    """One SSE event per token (a batch of them in one write); an error event if the engine fails; then
    the usage chunk if asked, then ``[DONE]``: every stream ends complete or with an error."""
    if fmt.chat:
        yield "".join(fmt.role_chunk(c.index) for c in gen.choices)
    # a choice's prompt goes out before its first event: its prompt logprobs come with its first token
    to_echo = set() if fmt.echo is None else {c.index for c in gen.choices}
    try:
        async for batch in gen.events():
            count_finished(batch, metrics)
            if not to_echo:
                yield "".join(fmt.chunk(ev) for ev in batch)
                continue
            parts = []
            for ev in batch:
                if ev.index in to_echo:
                    to_echo.discard(ev.index)
                    parts.append(fmt.echo_chunk(gen.choices[ev.index]))
                parts.append(fmt.chunk(ev))
            yield "".join(parts)
    except GenerationFailed as e:
        yield fmt.error_event(APIError(e.status, str(e), code="shutting_down" if e.status == 503 else None).body())
    if fmt.include_usage:
        yield fmt.usage_chunk(gen)
    yield DONE


async def whole_body(request: Request, gen: Generation, fmt: ResponseFormat, metrics: ServerMetrics):
    """Collect the generation, aborting it if the client goes away meanwhile; the body, or a 500."""

    async def collect():
        async for batch in gen.events():
            count_finished(batch, metrics)

    collector, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({collector, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collector.done():
            collector.cancel()
            gen.cancel()
            count_aborted(gen, metrics)
    if not collector.done() or collector.cancelled():
        return Response(status_code=499)  # client closed the request; nobody reads this
    try:
        collector.result()
    except GenerationFailed as e:
        raise APIError(e.status, str(e)) from None
    return fmt.body(gen)
