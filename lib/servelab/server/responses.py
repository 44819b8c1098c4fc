"""Response bodies: OpenAI's completion and chat-completion objects, and their server-sent-event chunks.

A stream carries one ``data: {...}`` event per generated token, then an optional usage chunk, then
``data: [DONE]``. Chunks are formatted from a prefix rendered once per response (id, object,
created, model), because at tens of thousands of tokens per second the per-token JSON work of the
HTTP thread competes with the engine thread for the GIL; logprobs and ``echo`` (``logprob_format.py``) are
formatted only for the requests that ask for them.
"""

from __future__ import annotations

import json

from servelab.server.generation import Choice, ChoiceEvent, Generation
from servelab.server.logprob_format import TokenTexts, chat_logprob_entries, completion_logprobs
from servelab.server.protocol import completion_id, now_s, usage

DONE = "data: [DONE]\n\n"


def _finish(reason: str | None) -> str:
    return "null" if reason is None else f'"{reason}"'


class ResponseFormat:
    """The bodies of one response (``chat`` or text completion)."""

    def __init__(
        self,
        model_name: str,
        *,
        chat: bool,
        return_token_ids: bool,
        include_usage: bool,
        logprobs: int | None = None,
        texts: TokenTexts | None = None,
        echo: list[str] | None = None,
    ):
        """``logprobs``: how many top tokens each position reports (None: no logprobs); ``texts``: token texts (needed
        with logprobs); ``echo``: each choice's prompt text, put before its answer (completions)."""
        self.chat, self.return_token_ids, self.include_usage = chat, return_token_ids, include_usage
        self.logprobs, self.texts, self.echo = logprobs, texts, echo
        self._offsets: dict[int, int] = {}  # per choice: text offset of its next token (completions' logprobs)
        self.id = completion_id("chatcmpl" if chat else "cmpl")
        self.created = now_s()
        self.model = model_name
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._prefix = (
            f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},'
            f'"model":{json.dumps(model_name)},"choices":[{{"index":'
        )
        self._suffix = '}],"usage":null}\n\n' if include_usage else "}]}\n\n"

    # ---- streaming ------------------------------------------------------------------------------
    def role_chunk(self, index: int) -> str:
        """A chat stream opens each choice with the assistant role."""
        return (
            f'{self._prefix}{index},"delta":{{"role":"assistant","content":""}},"logprobs":null,'
            f'"finish_reason":null{self._suffix}'
        )

    def echo_chunk(self, c: Choice) -> str:
        """A completion stream's first chunk of a choice with ``echo``: the prompt, and its logprobs if asked."""
        logprobs = self._prompt_logprobs(c)
        return (
            f'{self._prefix}{c.index},"text":{json.dumps(self.echo[c.index])},"logprobs":{json.dumps(logprobs)},'
            f'"finish_reason":null{self._suffix}'
        )

    def chunk(self, ev: ChoiceEvent) -> str:
        if self.chat:
            body = f'"delta":{{"content":{json.dumps(ev.text)}}}' if ev.text else '"delta":{}'
        else:
            body = f'"text":{json.dumps(ev.text)}'
        ids = ""
        if self.return_token_ids:
            ids = ',"token_ids":[]' if ev.token_id is None else f',"token_ids":[{ev.token_id}]'
        logprobs = "null" if self.logprobs is None or ev.logprob is None else json.dumps(self._chunk_logprobs(ev))
        return (
            f'{self._prefix}{ev.index},{body},"logprobs":{logprobs},"finish_reason":{_finish(ev.finish_reason)}'
            f"{ids}{self._suffix}"
        )

    def _chunk_logprobs(self, ev: ChoiceEvent) -> dict:
        if self.chat:
            return {"content": chat_logprob_entries([ev.logprob], self.logprobs, self.texts)}
        offset = self._offsets.get(ev.index, 0)
        out = completion_logprobs([ev.token_id], [ev.logprob], self.logprobs, self.texts, offset)
        self._offsets[ev.index] = offset + len(out["tokens"][0])
        return out

    def _prompt_logprobs(self, c: Choice) -> dict | None:
        """The prompt part of a completion's logprobs with ``echo`` (None without logprobs)."""
        if self.logprobs is None or c.prompt_logprobs is None:
            return None
        out = completion_logprobs(c.prompt_ids, c.prompt_logprobs, self.logprobs, self.texts)
        self._offsets[c.index] = sum(len(t) for t in out["tokens"])
        return out

    def _choice_logprobs(self, c: Choice) -> dict | None:
        """A whole choice's logprobs (prompt first with ``echo``), or None when not asked."""
        if self.logprobs is None:
            return None
        if self.chat:
            return {"content": chat_logprob_entries(c.logprobs, self.logprobs, self.texts)}
        head = self._prompt_logprobs(c) if self.echo is not None else None
        offset = self._offsets.get(c.index, 0) if head is not None else 0
        ids = c.token_ids[: len(c.logprobs)]
        tail = completion_logprobs(ids, c.logprobs, self.logprobs, self.texts, offset)
        return tail if head is None else {k: head[k] + tail[k] for k in tail}

    def usage_chunk(self, gen: Generation) -> str:
        obj = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(gen.prompt_tokens, gen.completion_tokens),
        }
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

    @staticmethod
    def error_event(body: dict) -> str:
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    # ---- whole responses ----------------------------------------------------------------------------
    def body(self, gen: Generation) -> dict:
        choices = []
        for c in gen.choices:
            choice = (
                {"index": c.index, "message": {"role": "assistant", "content": c.text.text}}
                if self.chat
                else {"index": c.index, "text": (self.echo[c.index] if self.echo else "") + c.text.text}
            )
            choice |= {"logprobs": self._choice_logprobs(c), "finish_reason": c.finish_reason}
            if self.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(gen.prompt_tokens, gen.completion_tokens),
        }
