"""Reading a request: the body under a size limit, strict parsing into a pydantic model (400, never 422),
unknown fields ignored with one warning per field name (as vLLM does), and noticing that the client went away."""

from __future__ import annotations

import logging
import threading

from fastapi import Request
from pydantic import ValidationError

from servelab.server.errors import APIError, from_validation_error
from servelab.server.protocol import unknown_fields

log = logging.getLogger("servelab.server")
_warned: set[str] = set()  # field names already logged: a client sending one on every request logs it once
_warned_lock = threading.Lock()


def warn_unknown(model) -> list[str]:
    """Log the unknown fields of a parsed request that were not logged before; the new ones."""
    with _warned_lock:
        new = [f for f in unknown_fields(model) if f not in _warned]
        _warned.update(new)
    if new:
        log.warning("the following fields were present in the request but ignored: %s", sorted(new))
    return new


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
        req = model_cls.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None
    warn_unknown(req)
    return req


async def until_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
