"""The endpoints beside OpenAI's, in vLLM's shapes: ``/health``, ``/metrics`` (Prometheus), ``/version``,
``/tokenize`` and ``/detokenize``. No API key, as in vLLM (it guards ``/v1`` only)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import servelab
from servelab.server.errors import APIError
from servelab.server.protocol import DetokenizeRequest, TokenizeRequest
from servelab.server.request_body import parse
from servelab.server.routes_openai import chat_prompt_ids, server_state

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """200 while the engine serves; 503 while draining or once the engine (thread or process) has stopped."""
    loop = server_state(request).loop
    if loop.draining or not loop.alive:
        return JSONResponse({"status": "draining" if loop.draining else "engine stopped"}, status_code=503)
    return {"status": "ok"}


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def version():
    return {"version": servelab.__version__}


@router.post("/tokenize")
async def tokenize(request: Request):
    """``{"count", "max_model_len", "tokens", "token_strs"}`` for a prompt, or for chat messages rendered by
    the chat template."""
    state = server_state(request)
    req = await parse(request, TokenizeRequest, state.settings.max_body_bytes)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give either prompt or messages", param="prompt")
    if req.messages is not None:
        ids = chat_prompt_ids(state, req.messages)
    else:
        ids = state.codec.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    strs = [state.codec.decode([t]) for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids, "token_strs": strs}


@router.post("/detokenize")
async def detokenize(request: Request):
    state = server_state(request)
    req = await parse(request, DetokenizeRequest, state.settings.max_body_bytes)
    state.check_model(req.model)
    if req.tokens:
        state.check_token_range(req.tokens, param="tokens")
    return {"prompt": state.codec.decode(req.tokens)}
