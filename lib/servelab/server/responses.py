"""Response bodies: OpenAI's completion and chat-completion objects, and their server-sent-event chunks.

A stream carries one ``data: {...}`` event per generated token, then an optional usage chunk, then
``data: [DONE]``. Chunks are formatted from a prefix rendered once per response (id, object,
created, model), because at tens of thousands of tokens per second the per-token JSON work of the
HTTP thread competes with the engine thread for the GIL.
"""

from __future__ import annotations

import json

from servelab.server.generation import ChoiceEvent, Generation
from servelab.server.protocol import completion_id, now_s, usage

DONE = "data: [DONE]\n\n"


def _finish(reason: str | None) -> str:
    return "null" if reason is None else f'"{reason}"'


class ResponseFormat:
    """The bodies of one response (``chat`` or text completion)."""

    def __init__(self, model_name: str, *, chat: bool, return_token_ids: bool, include_usage: bool):
        self.chat, self.return_token_ids, self.include_usage = chat, return_token_ids, include_usage
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

    def chunk(self, ev: ChoiceEvent) -> str:
        if self.chat:
            body = f'"delta":{{"content":{json.dumps(ev.text)}}}' if ev.text else '"delta":{}'
        else:
            body = f'"text":{json.dumps(ev.text)}'
        ids = ""
        if self.return_token_ids:
            ids = ',"token_ids":[]' if ev.token_id is None else f',"token_ids":[{ev.token_id}]'
        return (
            f'{self._prefix}{ev.index},{body},"logprobs":null,"finish_reason":{_finish(ev.finish_reason)}'
            f"{ids}{self._suffix}"
        )

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
                else {"index": c.index, "text": c.text.text}
            )
            choice |= {"logprobs": None, "finish_reason": c.finish_reason}
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
