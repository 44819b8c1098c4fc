"""The HTTP server with the official ``openai`` client and raw HTTP: outputs, errors, limits, disconnects.

One real uvicorn server (in a thread) on 127.0.0.1 serves ``config:tiny-llama`` in float32 on the CPU.
Expected outputs come from ``engine.generate`` on the same engine before the server starts.
"""

import json
import time

import httpx
import openai
import pytest
from test_server_text import tiny_hf_tokenizer

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.server import ServerThread
from servelab.server.app import ServerSettings
from servelab.server.tokenizer import ByteTokenizer, HFTokenizer, special_ids

MODEL = "config:tiny-llama"
KEY = "sk-test"
PROMPTS = [[5, 6, 7], [10, 20, 30, 40, 50, 60, 70], [300, 301, 302, 303]]
TEXT = "Hello, servelab"
LONG = 48  # tokens of the stop-string test's reference output


def tiny_engine() -> Engine:
    return Engine.from_spec(
        MODEL,
        dtype="float32",
        device="cpu",
        seed=0,
        config=EngineConfig(num_blocks=512, max_num_seqs=256, max_num_batched_tokens=2048),
    )


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture(scope="module")
def codec(engine):
    return ByteTokenizer(engine.model.shape.vocab, special_ids(engine.model.config))


@pytest.fixture(scope="module")
def expected(engine, codec):
    """Greedy reference outputs (token ids), computed before the server owns the engine."""
    out = engine.generate(PROMPTS + [codec.encode(TEXT)], SamplingParams(max_tokens=8))
    long = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=LONG, ignore_eos=True))[0]
    assert engine.block_manager.num_used_blocks == 0
    return {"ids": out[: len(PROMPTS)], "text": out[-1], "long": long}


@pytest.fixture(scope="module")
def server(engine, codec, expected):
    settings = ServerSettings(model_name="tiny", api_key=KEY, max_body_bytes=64 * 1024)
    with ServerThread(engine, codec, settings) as srv:
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        yield c


def wait_blocks_free(engine, timeout_s=15.0):
    """Until the KV pool is back to empty (the baseline of an idle server); the number in use."""
    deadline = time.monotonic() + timeout_s
    while engine.block_manager.num_used_blocks and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine.block_manager.num_used_blocks


def sse_events(text: str) -> list:
    lines = [ln for ln in text.split("\n\n") if ln.strip()]
    assert all(ln.startswith("data: ") for ln in lines), lines
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[len("data: ") :]) for ln in lines[:-1]]


# ---- the openai client ---------------------------------------------------------------------------


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_greedy_completion_equals_engine_generate(client, expected):
    for prompt, want in zip(PROMPTS, expected["ids"], strict=True):
        r = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=8, temperature=0, extra_body={"return_token_ids": True}
        )
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == want
        assert choice.finish_reason == ("length" if len(want) == 8 else "stop")
        assert r.object == "text_completion" and r.id.startswith("cmpl-") and choice.logprobs is None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(want))


def test_streamed_completion_equals_engine_generate(client, codec, expected):
    want = expected["text"]
    stream = client.completions.create(
        model="tiny",
        prompt=TEXT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices]
    assert [c.choices[0].model_extra["token_ids"][0] for c in token_chunks] == want  # one chunk per token
    assert [c.choices[0].finish_reason for c in token_chunks][:-1] == [None] * (len(want) - 1)
    assert token_chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(c.choices[0].text for c in token_chunks) == codec.decode(want[: 8 if len(want) == 8 else -1])
    assert chunks[-1].usage.completion_tokens == len(want) and chunks[-1].usage.prompt_tokens == len(TEXT)


def test_batch_of_prompts_gives_one_choice_each(client, expected):
    r = client.completions.create(
        model="tiny", prompt=PROMPTS, max_tokens=8, temperature=0, extra_body={"return_token_ids": True}
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in r.choices] == expected["ids"]


def test_stop_string_ends_the_request_and_frees_its_blocks(client, server, codec, expected):
    full = codec.decode(expected["long"])
    stop = next(full[i : i + 2] for i in range(len(full) // 2, len(full) - 1) if full[i : i + 2].strip())
    cut = full[: full.find(stop)]
    r = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=LONG, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        max_tokens=LONG,
        temperature=0,
        stop=stop,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert wait_blocks_free(server.engine) == 0


def test_stop_token_ids_extension(client, expected):
    want = expected["long"]
    stop_id = want[5]
    first = want.index(stop_id)
    r = client.completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        max_tokens=LONG,
        temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [stop_id], "return_token_ids": True},
    )
    assert r.choices[0].model_extra["token_ids"] == want[: first + 1]
    assert r.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    kw = dict(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        seed=1234,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    a = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    b = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    assert a == b and len(a) == 12


def test_chat_without_a_template_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 400 and "chat template" in e.value.message


# ---- bad input -------------------------------------------------------------------------------------

BAD = [
    (b'{"prompt": [1, 2', 400, "malformed_json"),
    (json.dumps({"prompt": [1, 2], "max_tokens": -1}), 400, None),
    (json.dumps({"prompt": [1, 2], "max_tokens": 10**12}), 400, "context_length_exceeded"),
    (json.dumps({"prompt": [1, 2], "max_tokens": "8"}), 400, None),
    (json.dumps({"prompt": [1, 2], "temperature": "hot"}), 400, None),
    (json.dumps({"prompt": [1, 512]}), 400, "token_id_out_of_range"),
    (json.dumps({"prompt": [-1]}), 400, "token_id_out_of_range"),
    (json.dumps({"prompt": ""}), 400, "empty_prompt"),
    (json.dumps({"prompt": []}), 400, "empty_prompt"),
    (json.dumps({"prompt": [[1], []]}), 400, "empty_prompt"),
    (json.dumps({"prompt": list(range(3, 259)) * 16}), 400, "context_length_exceeded"),
    (json.dumps({"prompt": [1, 2], "n": 0}), 400, "greater_than_equal"),
    (json.dumps({"prompt": [1, 2], "n": 1000}), 400, "less_than_equal"),
    (json.dumps({"prompt": [1, 2], "logprobs": 21}), 400, "less_than_equal"),
    (json.dumps({"prompt": [1, 2], "presence_penalty": -3}), 400, None),
    (json.dumps({"prompt": [1, 2], "frequency_penalty": 2.5}), 400, None),
    (json.dumps({"prompt": [1, 2], "repetition_penalty": -1}), 400, None),
    (json.dumps({"prompt": [1, 2], "top_k": -2}), 400, None),
    (json.dumps({"prompt": [1, 2], "min_p": 2}), 400, None),
    (json.dumps({"prompt": [1, 2], "min_tokens": 9, "max_tokens": 4}), 400, None),
    (json.dumps({"prompt": [1, 2], "logit_bias": {"one": 5}}), 400, None),
    (json.dumps({"prompt": [1, 2], "logit_bias": {"100000": 5}}), 400, "token_id_out_of_range"),
    (json.dumps({"prompt": [1, 2], "max_tokens": 0}), 400, "unsupported"),
    (json.dumps({"prompt": [1, 2], "suffix": "x"}), 400, "unsupported"),
    (json.dumps({"prompt": [1, 2], "response_format": {"type": "json_object"}}), 400, "unsupported"),
    (json.dumps({"prompt": [1, 2], "stop": [""]}), 400, None),
    (json.dumps({"prompt": [1, 2], "model": "gpt-4"}), 404, "model_not_found"),
    (json.dumps([1, 2, 3]), 400, None),
]


@pytest.mark.parametrize("body, status, code", BAD)
def test_bad_input_gets_an_openai_error_and_costs_nothing(http, server, expected, body, status, code):
    r = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if code is not None:
        assert err["code"] == code
    # the next good request is unaffected
    ok = http.post(
        "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"] == expected["ids"][0]
    assert wait_blocks_free(server.engine) == 0


def test_oversized_body_is_413(http):
    big = json.dumps({"prompt": "x" * (70 * 1024)})
    r = http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_api_key_is_required_on_v1_only(server):
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        assert c.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = c.post("/v1/completions", json={"prompt": [1, 2]}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_full_queue_is_429_with_retry_after(http, server, client):
    loop = server.state.loop
    # no free running slot and no room to wait: every new request finds the queue full
    (old, loop.max_waiting), (slots, loop.max_running) = (loop.max_waiting, 0), (loop.max_running, 0)
    try:
        r = http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="tiny", prompt=[1, 2], max_tokens=2)
    finally:
        loop.max_waiting, loop.max_running = old, slots
    assert http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}).status_code == 200


# ---- disconnects -----------------------------------------------------------------------------------


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(server):
    engine = server.engine
    assert wait_blocks_free(engine) == 0
    body = {"prompt": PROMPTS[1], "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as c,
        c.stream("POST", "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        data = (ln for ln in r.iter_lines() if ln.startswith("data: "))
        got = [next(data) for _ in range(3)]  # three tokens, then the client goes away mid-stream
        assert len(got) == 3
        assert engine.block_manager.num_used_blocks > 0  # the request is running
    # the connection is closed: the engine must drop the request and free its KV blocks
    assert wait_blocks_free(engine) == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert 'servelab_requests_finished_total{finish_reason="abort"}' in server.state.metrics.render().decode()


def test_client_timeout_on_a_non_streaming_request_aborts_it(server):
    engine = server.engine
    body = {"prompt": PROMPTS[2], "max_tokens": 3000, "temperature": 0, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/completions", json=body)
    assert wait_blocks_free(engine) == 0
    assert not engine.scheduler.running


def test_code_runs_on_the_engine_thread_between_steps(server):
    loop = server.state.loop
    assert loop.call(lambda lp: (lp.engine.block_manager.num_used_blocks, len(lp.engine.scheduler.running))).result(
        10
    ) == (0, 0)
    with pytest.raises(ZeroDivisionError):
        loop.call(lambda lp: 1 / 0).result(10)


def test_metrics_expose_queue_running_kv_and_latency(http):
    http.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4, "ignore_eos": True})
    assert http.post("/v1/completions", json={"prompt": []}).status_code == 400
    text = http.get("/metrics").text
    for name in (
        "servelab_num_requests_waiting",
        "servelab_num_requests_running",
        "servelab_kv_blocks_used",
        "servelab_kv_blocks_total 512.0",
        "servelab_time_to_first_token_seconds_bucket",
        "servelab_inter_token_latency_seconds_bucket",
        "servelab_prefix_cache_hit_rate",
        'servelab_requests_finished_total{finish_reason="length"}',
        'servelab_requests_rejected_total{status="400"}',
    ):
        assert name in text, name
    count = next(
        float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("servelab_time_to_first_token_seconds_count")
    )
    assert count >= 1


# ---- chat, with a tokenizer that has a template ---------------------------------------------------


def test_chat_completions_with_a_chat_template():
    hf = tiny_hf_tokenizer()
    codec = HFTokenizer(hf)
    engine = tiny_engine()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]
    ids = codec.chat_prompt(messages)
    want = engine.generate([ids], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    with ServerThread(engine, codec, ServerSettings(model_name="chat")) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(
            model="chat",
            messages=messages,
            max_tokens=10,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.choices[0].model_extra["token_ids"] == want
        assert r.choices[0].message.content == hf.decode(want, skip_special_tokens=True)
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 10
        stream = client.chat.completions.create(
            model="chat", messages=messages, max_tokens=10, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == "length"
