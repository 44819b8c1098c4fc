"""Hundreds of simultaneous streams against one server: every stream complete, well formed, exact.

Each of 240 clients streams a different prompt at once (aiohttp, one connection each), with bad
requests mixed in. Every good stream must be ``[DONE]``-terminated, carry one chunk per token with
consistent ids, and its tokens must equal that prompt's greedy output from ``engine.generate``
(nothing lost, duplicated or swapped between streams). Bad requests get 400 and disturb nothing.
"""

import asyncio
import json
import random

import aiohttp
import pytest

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.server import ServerThread

STREAMS = 240
MAX_TOKENS = 6
BAD_EVERY = 12  # one malformed request in every 12


@pytest.fixture(scope="module")
def setup():
    engine = Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        seed=0,
        config=EngineConfig(num_blocks=1024, max_num_seqs=256, max_num_batched_tokens=1024),
    )
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(4, 24))] for _ in range(STREAMS)]
    expected = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    with ServerThread(engine) as srv:
        yield srv, prompts, expected


async def one_stream(session, url, i, prompt):
    if i % BAD_EVERY == 0:
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": "zero", "stream": True}
    else:
        body = {
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }
    async with session.post(url, json=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


def parse_stream(text: str):
    """(token ids, finish reasons, usage, ids of the chunks); asserts the SSE framing."""
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-1:]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(e.startswith("data: ") for e in events)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    tokens, reasons = [], []
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        assert choice["index"] == 0 and c["object"] == "text_completion"
        tokens += choice["token_ids"]
        reasons.append(choice["finish_reason"])
    return tokens, reasons, usage, {c["id"] for c in chunks}


def test_hundreds_of_simultaneous_streams_are_complete_and_exact(setup):
    srv, prompts, expected = setup

    async def main():
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
            url = srv.base_url + "/v1/completions"
            return await asyncio.gather(*(one_stream(session, url, i, p) for i, p in enumerate(prompts)))

    results = asyncio.run(main())
    good = 0
    for i, ((status, ctype, text), prompt, want) in enumerate(zip(results, prompts, expected, strict=True)):
        if i % BAD_EVERY == 0:
            assert status == 400 and json.loads(text)["error"]["param"] == "temperature"
            continue
        assert status == 200 and ctype.startswith("text/event-stream"), (status, text[:200])
        tokens, reasons, usage, ids = parse_stream(text)
        assert tokens == want, f"stream {i}"
        assert reasons[:-1] == [None] * (len(want) - 1) and reasons[-1] in ("length", "stop")
        assert usage == {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(want),
            "total_tokens": len(prompt) + len(want),
        }
        assert len(ids) == 1  # every chunk of a stream carries that stream's id
        good += 1
    assert good == STREAMS - len(range(0, STREAMS, BAD_EVERY))
    engine = srv.engine
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
    metrics = srv.state.metrics.render().decode()
    finished = sum(
        float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith("servelab_requests_finished_total")
    )
    assert finished == good
