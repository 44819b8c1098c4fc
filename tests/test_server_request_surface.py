"""The whole OpenAI / vLLM request surface through the official ``openai`` client, against a live server on
127.0.0.1: n, logprobs and top_logprobs (completions and chat, streamed and not), echo with the prompt's logprobs
(an lm-eval loglikelihood request), penalties, top_k, min_p, min_tokens, unknown fields, and the queue rule.

One uvicorn server (in a thread) serves ``config:tiny-llama`` in float32 on the CPU, with prefix caching, a
byte-level tokenizer and a one-line chat template (so chat works on a model with random weights). References come
from HF's ``log_softmax`` on the same weights.
"""

import logging
import threading

import httpx
import openai
import pytest
import torch

from servelab.engine import Engine, EngineConfig
from servelab.models import load_model
from servelab.server import ServerThread
from servelab.server.app import ServerSettings
from servelab.server.engine_loop import QueueFull, check_room
from servelab.server.tokenizer import ByteTokenizer, special_ids

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPT = "The quick brown fox jumps over the lazy dog; " * 2  # 90 bytes: 5 full blocks of 16


@pytest.fixture(scope="module")
def hf():
    return load_model("config:tiny-llama").model


@pytest.fixture(scope="module")
def server(hf):
    engine = Engine.from_hf(hf, EngineConfig(num_blocks=512, max_num_seqs=8, prefix_caching=True))
    codec = ByteTokenizer(engine.model.shape.vocab, special_ids(engine.model.config), TEMPLATE)
    with ServerThread(engine, codec, ServerSettings(model_name="tiny")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def ref_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)


def greedy_ids(client, prompt, n: int) -> list[int]:
    r = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    return r.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_loglikelihood_request(client, server, hf, max_tokens):
    """lm-eval's ``local-completions`` scoring: echo + logprobs=1 + max_tokens 0 or 1, temperature 0."""
    ids = server.codec.encode(PROMPT)
    r = client.completions.create(
        model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0
    )
    c = r.choices[0]
    lp = c.logprobs
    n = len(ids) + max_tokens
    assert c.text.startswith(PROMPT) and len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens[: len(ids)]) == PROMPT and lp.text_offset[:3] == [0, 1, 2]
    ref = ref_logprobs(hf, ids)
    for p in range(1, len(ids)):
        assert lp.token_logprobs[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=1e-4)
        greedy = ref[p - 1].argmax().item()
        assert server.codec.decode([greedy]) in lp.top_logprobs[p]  # lm-eval's is_greedy reads this
        assert len(lp.top_logprobs[p]) in (1, 2)  # the top token, and the prompt's if it is another
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == max_tokens
    if max_tokens == 0:
        assert c.text == PROMPT and c.finish_reason == "length"


def test_scoring_a_continuation_gives_the_logprobs_it_was_generated_with(client, server):
    ids = server.codec.encode(PROMPT)
    gen = client.completions.create(
        model="tiny", prompt=ids, max_tokens=6, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    cont = greedy_ids(client, ids, 6)
    scored = client.completions.create(model="tiny", prompt=ids + cont, echo=True, logprobs=0, max_tokens=0)
    got = scored.choices[0].logprobs.token_logprobs[len(ids) :]
    assert got == pytest.approx(gen.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_completion_logprobs_streamed_and_whole_agree(client):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 3}
    whole = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].logprobs
    chunks = [
        c.choices[0].logprobs for c in client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    ]
    streamed = [lp for lp in chunks if lp is not None]
    assert [x.token_logprobs[0] for x in streamed] == pytest.approx(whole.token_logprobs, abs=1e-6)
    assert [x.text_offset[0] for x in streamed] == whole.text_offset
    # top 3, plus the sampled token if not among them (fewer where tokens share a text: non-byte ids decode to "")
    assert all(1 <= len(t) <= 4 for t in whole.top_logprobs) and max(len(t) for t in whole.top_logprobs) >= 3


def test_chat_logprobs_and_top_logprobs(client, server, hf):
    messages = [{"role": "user", "content": "hello there"}]
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    ids = server.codec.encode("hello there")
    out = [server.codec.encode(e.token)[0] if e.token else None for e in content]
    ref = ref_logprobs(hf, ids + greedy_ids(client, ids, 4))
    for k, e in enumerate(content):
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.logprob == pytest.approx(ref[len(ids) - 1 + k].max().item(), abs=1e-4)  # greedy: the top one
        assert e.bytes == list(e.token.encode()) and (out[k] is None or e.token == e.top_logprobs[0].token)
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    streamed = [e.logprob for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in content], abs=1e-6)
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_n_choices_share_the_prompt_through_the_prefix_cache(client, server):
    cache = server.engine.block_manager.prefix_cache
    before = cache.stats()
    prompt = "n samples of one prompt share its blocks: " * 3  # a prompt no other test sends
    r = client.completions.create(
        model="tiny", prompt=prompt, n=4, max_tokens=6, temperature=1.0, seed=5, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.text for c in r.choices}) > 1  # seed + j per choice: they differ
    assert r.usage.prompt_tokens == len(prompt.encode()) and r.usage.completion_tokens == 24
    after = cache.stats()
    full_blocks = len(prompt.encode()) // 16
    hits = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    assert hits >= 3 * full_blocks * 16, (before, after)  # choices 1..3 took choice 0's full blocks
    again = client.completions.create(
        model="tiny", prompt=prompt, n=4, max_tokens=6, temperature=1.0, seed=5, extra_body={"ignore_eos": True}
    )
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    two = client.completions.create(model="tiny", prompt=["ab", "cd"], n=2, max_tokens=2, temperature=0)
    assert [c.index for c in two.choices] == [0, 1, 2, 3] and two.choices[0].text == two.choices[1].text


def test_vllm_sampling_fields_are_honoured(client, server):
    ids = server.codec.encode(PROMPT)
    greedy = greedy_ids(client, ids, 8)
    top1 = client.completions.create(
        model="tiny", prompt=ids, max_tokens=8, temperature=1.5,
        extra_body={"top_k": 1, "ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    assert top1.choices[0].model_extra["token_ids"] == greedy
    minp = client.completions.create(
        model="tiny", prompt=ids, max_tokens=8, temperature=1.0,
        extra_body={"min_p": 1.0, "ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    assert minp.choices[0].model_extra["token_ids"] == greedy  # min_p 1 keeps the top token only
    penalized = client.completions.create(
        model="tiny", prompt=ids, max_tokens=30, temperature=0, presence_penalty=2.0,
        extra_body={"repetition_penalty": 1.5, "ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    out = penalized.choices[0].model_extra["token_ids"]
    assert len(set(out)) == len(out)
    eos = server.engine.scheduler.eos_token_ids[0]
    held = client.completions.create(
        model="tiny", prompt=ids, max_tokens=10, temperature=0, logit_bias={str(eos): 100},
        extra_body={"min_tokens": 3, "return_token_ids": True},
    )  # fmt: skip
    assert held.choices[0].model_extra["token_ids"][-1] == eos and len(held.choices[0].model_extra["token_ids"]) == 4


def test_unknown_fields_are_ignored_and_logged_once(client, caplog):
    caplog.set_level(logging.WARNING, logger="servelab.server")
    for _ in range(3):
        r = client.completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_body={"surface_test_field": 1, "guided_choice": ["a"]}
        )
        assert r.choices[0].finish_reason
    warned = [rec.getMessage() for rec in caplog.records if "surface_test_field" in rec.getMessage()]
    assert len(warned) == 1 and "guided_choice" in warned[0]
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        response_format={"type": "text"}, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert chat.choices[0].message.role == "assistant"


def test_queue_limit_counts_only_requests_beyond_the_free_slots():
    check_room(waiting=10, adding=1, limit=2, free_slots=9)
    with pytest.raises(QueueFull):
        check_room(waiting=10, adding=2, limit=2, free_slots=9)
    check_room(waiting=0, adding=4, limit=0, free_slots=4)


def test_max_queue_zero_still_fills_the_free_running_slots(server):
    loop = server.state.loop
    old, loop.max_waiting = loop.max_waiting, 0
    statuses, lock = [], threading.Lock()
    body = {"prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True}

    def one():
        r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
        with lock:
            statuses.append(r.status_code)

    try:
        threads = [threading.Thread(target=one) for _ in range(loop.max_running + 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        loop.max_waiting = old
    assert statuses.count(200) >= loop.max_running and set(statuses) <= {200, 429}
