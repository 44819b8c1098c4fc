"""OpenAI's endpoints under ``/v1``: completions, chat completions, and the model list (with vLLM's
``/v1/models/{id}``). ``--api-key`` guards all of them (and only them, as in vLLM)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Request

from servelab.server.errors import APIError
from servelab.server.generation import Generation
from servelab.server.logprob_format import TokenTexts
from servelab.server.protocol import ChatCompletionRequest, CompletionRequest, now_s
from servelab.server.request_body import parse
from servelab.server.respond import respond
from servelab.server.state import ServerState
from servelab.server.tokenizer import NoChatTemplate


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def require_api_key(request: Request) -> None:
    key = server_state(request).settings.api_key
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")


router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def model_card(state: ServerState) -> dict:
    """One entry of ``/v1/models``, in vLLM's shape (OpenAI's fields, plus ``root`` and ``max_model_len``)."""
    name = state.settings.model_name
    return {
        "id": name,
        "object": "model",
        "created": now_s(),
        "owned_by": "servelab",
        "root": name,
        "parent": None,
        "max_model_len": state.max_model_len,
    }


@router.get("/models")
async def models(request: Request):
    return {"object": "list", "data": [model_card(server_state(request))]}


@router.get("/models/{model_id:path}")
async def model(model_id: str, request: Request):
    state = server_state(request)
    if model_id != state.settings.model_name:
        raise APIError(
            404,
            f"the model {model_id!r} does not exist; this server serves {state.settings.model_name!r}",
            param="model",
            code="model_not_found",
        )
    return model_card(state)


async def generate(
    request: Request,
    state: ServerState,
    req,
    prompts: list[list[int]],
    max_tokens: int | None,
    *,
    chat: bool,
    logprobs: int | None = None,
    echo: list[str] | None = None,
):
    """Run ``req.n`` choices per prompt (choice ``i * n + j`` is prompt i's j-th, OpenAI's order) and respond.

    The n choices of a prompt are n engine requests with one prompt: admitted in the same step, they share its
    KV blocks through the prefix cache when it is on (``--enable-prefix-caching``). With ``echo`` and logprobs
    each choice asks for the prompt's logprobs (it then computes its whole prompt, cache or not)."""
    prompt_lps = logprobs if echo is not None else None
    choices = [(p, j) for p in prompts for j in range(req.n)]
    params = [
        state.sampling_params(req, len(p), max_tokens, logprobs=logprobs, prompt_logprobs=prompt_lps, seed_offset=j)
        for p, j in choices
    ]
    gen = Generation(
        state.loop,
        state.codec,
        [p for p, _ in choices],
        params,
        req.stop_strings(),
        retry_after_s=state.settings.retry_after_s,
        mailbox=state.mailbox,
        echo_only=echo is not None and max_tokens == 0,
    )
    await gen.start()
    return await respond(
        request,
        gen,
        req,
        chat=chat,
        model_name=state.settings.model_name,
        metrics=state.metrics,
        logprobs=logprobs,
        texts=TokenTexts(state.codec) if logprobs is not None else None,
        echo=None if echo is None else [echo[i] for i in range(len(prompts)) for _ in range(req.n)],
    )


def prompt_texts(state: ServerState, prompt, prompts: list[list[int]]) -> list[str]:
    """The text of each prompt, for ``echo``: as the client wrote it, or its token ids decoded."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return list(prompt)
    return [state.codec.decode(ids) for ids in prompts]


@router.post("/completions")
async def completions(request: Request):
    state = server_state(request)
    req = await parse(request, CompletionRequest, state.settings.max_body_bytes)
    state.check_common(req)
    prompts = state.prompt_ids(req.prompt)
    echo = prompt_texts(state, req.prompt, prompts) if req.echo else None
    return await generate(request, state, req, prompts, req.max_tokens, chat=False, logprobs=req.logprobs, echo=echo)


def chat_prompt_ids(state: ServerState, messages) -> list[int]:
    """The chat template applied to ``messages`` (400 without a template or on an empty result)."""
    try:
        ids = state.codec.chat_prompt([{"role": m.role, "content": m.text()} for m in messages])
    except NoChatTemplate as e:
        raise APIError(400, str(e), param="messages", code="no_chat_template") from None
    if not ids:
        raise APIError(400, "the chat template produced an empty prompt", param="messages")
    return ids


@router.post("/chat/completions")
async def chat_completions(request: Request):
    state = server_state(request)
    req = await parse(request, ChatCompletionRequest, state.settings.max_body_bytes)
    state.check_common(req)
    ids = chat_prompt_ids(state, req.messages)
    state.check_ids(ids)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return await generate(request, state, req, [ids], max_tokens, chat=True, logprobs=req.num_logprobs)
