"""One HTTP request's generation, on the asyncio side: submit its prompts, then turn engine updates into
per-token events with text.

A request may carry several prompts (a batch of completions); each is its own engine request and its own
choice. They are submitted all or none (a full queue refuses the whole request and keeps nothing of it).
``start()`` returns once the engine thread has accepted all of them, so that a prompt the engine refuses
becomes a 400 before any response has begun. ``events()`` yields one ``ChoiceEvent`` per generated token
(in batches of those that have arrived), so a streaming client sees every token (the text of a token may
be empty: an incomplete character, text held back by a stop string, or a special token).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

from servelab.engine import SamplingParams
from servelab.engine.sequence import FinishReason
from servelab.errors import ParameterError
from servelab.server.engine_loop import Accepted, Draining, EngineLoop, Handle, QueueFull, Rejected, Tokens
from servelab.server.errors import APIError
from servelab.server.output_text import OutputText
from servelab.server.tokenizer import TextCodec

FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.ABORT: "abort",
}


class GenerationFailed(Exception):
    """The engine failed while generating (after the response may have begun); ``status`` 503 when the server
    was stopping (a second SIGINT, or the end of --drain-timeout), 500 otherwise."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


class ChoiceEvent(NamedTuple):
    index: int
    text: str  # text that may be sent now (possibly empty)
    token_id: int | None  # the generated token (None on a finish without a new token)
    finish_reason: str | None  # "stop", "length" or "abort" on the choice's last event
    logprob: object = None  # the token's TokenLogprob, when the request asked for logprobs


@dataclass(eq=False)
class Choice:
    """One choice of a response. ``echo_only``: a scoring request (``echo`` with ``max_tokens=0``): the engine
    generates one token to compute the prompt (its requests need one), which is not part of the answer."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    text: OutputText
    handle: Handle | None = None
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    echo_only: bool = False
    logprobs: list = field(default_factory=list)  # one TokenLogprob per generated token (if asked)
    prompt_logprobs: list | None = None  # one TokenLogprob (None for the first) per prompt token (if asked)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Mailbox:
    """Hands engine-thread updates to one asyncio loop, waking it once per batch rather than once per update.

    At a decode step of 64 sequences the engine thread produces 64 updates at once; one
    ``call_soon_threadsafe`` (a write to the loop's self-pipe) for all of them instead of 64 keeps the
    HTTP thread's work, and its competition with the engine thread for the GIL, small.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, queue: asyncio.Queue, item) -> None:
        """Called from any thread: ``queue.put_nowait(item)`` on the loop, soon."""
        self._items.append((queue, item))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False  # posts from now on schedule another drain; this one takes what it sees
        while self._items:
            queue, item = self._items.popleft()
            queue.put_nowait(item)


class Generation:
    def __init__(
        self,
        engine_loop: EngineLoop,
        codec: TextCodec,
        prompts: list[list[int]],
        params: list[SamplingParams],
        stop_strings: list[str],
        *,
        retry_after_s: int = 1,
        mailbox: Mailbox | None = None,
        echo_only: bool = False,
    ):
        self.engine_loop = engine_loop
        self.mailbox = mailbox
        self.retry_after_s = retry_after_s
        self.choices = [
            Choice(i, p, sp, OutputText(codec.new_decoder(p), stop_strings), echo_only=echo_only)
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]
        self.queue: asyncio.Queue = asyncio.Queue()
        self._early: list = []  # token updates that arrived while start() was still waiting for acceptances

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the distinct prompts (the ``n`` choices of one prompt count it once, as in OpenAI)."""
        seen, total = set(), 0
        for c in self.choices:
            if id(c.prompt_ids) not in seen:
                seen.add(id(c.prompt_ids))
                total += len(c.prompt_ids)
        return total

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.choices)

    async def start(self) -> None:
        """Submit every prompt and wait until the engine thread accepted them all; ``APIError`` otherwise
        (400 for a prompt the engine refuses, 429 for a full queue, 503 while draining)."""
        self._submit(self.mailbox or Mailbox(asyncio.get_running_loop()))
        pending = {c.index for c in self.choices}
        try:
            while pending:
                i, update = await self.queue.get()
                if isinstance(update, Accepted):
                    pending.discard(i)
                elif isinstance(update, Rejected):
                    raise self._refusal(update.error)
                elif isinstance(update, Tokens) and update.finish_reason is not None and not update.token_ids:
                    if i in pending:  # aborted before it was admitted: the server is shutting down
                        raise APIError(503, "the request was aborted: the server is stopping", code="shutting_down")
                    self._early.append((i, update))
                else:
                    self._early.append((i, update))
        except BaseException:
            self.cancel()  # e.g. the client went away while we waited
            raise

    def _submit(self, mailbox: Mailbox) -> None:
        def deliver_to(i: int):
            return lambda update: mailbox.post(self.queue, (i, update))

        try:
            handles = self.engine_loop.submit_all([(c.prompt_ids, c.params, deliver_to(c.index)) for c in self.choices])
        except QueueFull as e:
            raise APIError(
                429,
                f"server busy: {e}; retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None
        except Draining as e:
            raise APIError(
                503, str(e), code="shutting_down", headers={"Retry-After": str(self.retry_after_s)}
            ) from None
        for c, h in zip(self.choices, handles, strict=True):
            c.handle = h

    def _refusal(self, err: Exception) -> APIError:
        if isinstance(err, ParameterError):
            return APIError(400, str(err), param="prompt" if "prompt" in str(err) else None)
        if self.engine_loop.draining:  # stopped while it waited: the server's state, not a bug
            headers = {"Retry-After": str(self.retry_after_s)}
            return APIError(503, f"the server is stopping: {err}", code="shutting_down", headers=headers)
        return APIError(500, f"engine error: {type(err).__name__}: {err}")

    def cancel(self) -> None:
        """Abort every choice that has not finished (idempotent): the engine frees its KV blocks."""
        for c in self.choices:
            if c.handle is not None and not c.finished and not c.handle.cancelled:
                self.engine_loop.abort(c.handle)

    async def events(self) -> AsyncIterator[list[ChoiceEvent]]:
        """Per-token events, in batches of whatever has arrived (a streaming response writes a batch at once),
        until every choice has finished; raises ``GenerationFailed`` if the engine fails."""
        early, self._early = self._early, []
        batch = [ev for i, update in early for ev in self._apply(i, update)]
        if batch:
            yield batch
        while not self.finished:
            batch = self._apply(*await self.queue.get())
            while not self.queue.empty():
                batch += self._apply(*self.queue.get_nowait())
            if batch:
                yield batch

    def _apply(self, i: int, update) -> list[ChoiceEvent]:
        c = self.choices[i]
        if c.finished:
            return []  # tokens computed after a stop string, before the abort reached the engine
        if isinstance(update, Rejected):
            self.cancel()
            if self.engine_loop.draining:
                raise GenerationFailed(f"the server is stopping: {update.error}", status=503)
            raise GenerationFailed(f"engine error: {type(update.error).__name__}: {update.error}")
        if not isinstance(update, Tokens):
            return []
        if update.prompt_logprobs is not None:
            c.prompt_logprobs = update.prompt_logprobs
        if c.echo_only:  # the one token a scoring request generates is not part of its answer
            if update.finish_reason is None:
                return []
            c.finish_reason = "length"
            return [ChoiceEvent(i, "", None, "length")]
        out = self._tokens(c, update)
        if c.finish_reason == "stop" and c.text.stopped:
            return out
        if not update.token_ids and update.finish_reason is not None:
            c.finish_reason = FINISH_REASONS[update.finish_reason]
            out.append(ChoiceEvent(i, c.text.finish(), None, c.finish_reason))
        return out

    def _tokens(self, c: Choice, update: Tokens) -> list[ChoiceEvent]:
        """One event per token of ``update``; a stop string ends the choice (and aborts its engine request)."""
        out = []
        for k, tok in enumerate(update.token_ids):
            c.token_ids.append(tok)
            lp = update.logprobs[k] if update.logprobs is not None else None
            if lp is not None:
                c.logprobs.append(lp)
            last = k == len(update.token_ids) - 1 and update.finish_reason is not None
            # an EOS or stop token ends the text; its own text is not part of the output
            by_token = last and update.finish_reason in (FinishReason.EOS, FinishReason.STOP)
            text = "" if by_token else c.text.push(tok)
            if c.text.stopped:
                c.finish_reason = "stop"
                self.engine_loop.abort(c.handle)
                out.append(ChoiceEvent(c.index, text, tok, "stop", lp))
                return out
            if last:
                text += c.text.finish()
                c.finish_reason = "stop" if c.text.stopped else FINISH_REASONS[update.finish_reason]
            out.append(ChoiceEvent(c.index, text, tok, c.finish_reason, lp))
        return out
