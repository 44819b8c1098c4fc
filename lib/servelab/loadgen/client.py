"""One streaming completion request, every token timestamped on arrival.

``stream_completion`` POSTs ``/v1/completions`` with ``stream=true`` and ``ignore_eos=true`` (a vLLM
extension the servelab server honours, so a request produces exactly the tokens the trace asks for), the
prompt as token ids, and reads the server-sent events. Each event that carries a choice is one token
(the servelab server sends one per token, as vLLM does); its arrival is stamped with
``time.perf_counter()``, the same monotonic clock the server's step log uses, so the two timelines share
an axis when both run on one machine. If the server reports ``usage`` (``stream_options.include_usage``)
the token count is checked against it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class StreamResult:
    """What the client saw of one request; times are ``time.perf_counter()`` seconds."""

    sent: float = float("nan")
    token_times: list[float] = field(default_factory=list)
    finish: float = float("nan")
    ok: bool = False
    error: str = ""
    finish_reason: str | None = None
    usage_tokens: int | None = None


def completion_body(
    prompt: list[int] | str, max_tokens: int, model: str | None, *, seed: int | None = None, temperature: float = 0.0
) -> dict:
    """The request body: the prompt (token ids, or text), exactly ``max_tokens`` output tokens (EOS ignored), streamed,
    with the token ids in every chunk (``return_token_ids``, an extension the servelab server and recent
    vLLM accept) so that tokens are counted exactly even when a token's text is empty."""
    body = {
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        "max_tokens": int(max_tokens),
        "stream": True,
        "ignore_eos": True,
        "temperature": temperature,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    if seed is not None:
        body["seed"] = int(seed)
    return body


def _tokens_in(chunk: dict) -> int:
    """Tokens an SSE chunk delivers: one per chunk with a choice (or ``len(token_ids)`` when the server
    sends ids); 0 for the usage-only chunk at the end, and for a bare finish chunk with no text."""
    choices = chunk.get("choices") or []
    if not choices:
        return 0
    c = choices[0]
    if isinstance(c.get("token_ids"), list):
        return len(c["token_ids"])
    if c.get("finish_reason") is not None and not c.get("text"):
        return 0
    return 1


def _read_event(event: bytes, res: StreamResult, now: float) -> bool:
    """Book one server-sent event's tokens (arrived at ``now``) into ``res``; True if it is ``[DONE]``."""
    done = False
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        chunk = json.loads(payload)
        if "error" in chunk:
            raise RuntimeError(f"server error in stream: {chunk['error']}")
        res.token_times.extend([now] * _tokens_in(chunk))
        choices = chunk.get("choices")
        if choices and choices[0].get("finish_reason"):
            res.finish_reason = choices[0]["finish_reason"]
        if chunk.get("usage"):
            res.usage_tokens = int(chunk["usage"].get("completion_tokens", 0))
    return done


async def _read_stream(resp: aiohttp.ClientResponse, res: StreamResult) -> bool:
    """Read the response's events as they arrive; True if the stream ended with ``[DONE]``."""
    done = False
    buf = b""
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf += data
        # SSE events end with a blank line; a TCP read may hold several events or part of one
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            done |= _read_event(event, res, now)
    return done


def _judge(res: StreamResult, done: bool, body: dict) -> None:
    """Set ``res.ok``, or ``res.error`` saying why the stream is not a complete answer to ``body``."""
    n = len(res.token_times)
    if not done:
        res.error = "stream ended without [DONE]"
    elif res.usage_tokens is not None and res.usage_tokens != n:
        res.error = f"received {n} tokens but usage says {res.usage_tokens}"
    elif body.get("ignore_eos") and n != body["max_tokens"]:
        res.error = f"received {n} tokens, asked for {body['max_tokens']}"
    else:
        res.ok = True


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None, res: StreamResult | None = None
) -> StreamResult:
    """Send one streaming completion to ``url`` and time every token into ``res`` (a new ``StreamResult``
    if None), filled as tokens arrive so that a cancelled request keeps what it received. Never raises for
    a failed request (the error is in the result), only for cancellation."""
    res = StreamResult() if res is None else res
    try:
        res.sent = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                res.error = f"HTTP {resp.status}: {text}"
                res.finish = time.perf_counter()
                return res
            done = await _read_stream(resp, res)
            res.finish = res.token_times[-1] if res.token_times else time.perf_counter()
            _judge(res, done, body)
    except (aiohttp.ClientError, RuntimeError, ValueError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"[:300]
        res.finish = time.perf_counter()
    return res
