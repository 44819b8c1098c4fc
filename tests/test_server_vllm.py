"""vLLM's conventions beside this server's own: the command line, ``/version``, ``/tokenize``,
``/detokenize``, ``/v1/models/{id}``, and vLLM's metric set under the ``servelab:`` prefix (tiny model, CPU)."""

import re
import time

import httpx
import pytest

from servelab.engine import Engine, EngineConfig
from servelab.server import ServerThread
from servelab.server.app import ServerSettings
from servelab.server.cli import console_main
from servelab.server.flags import parse_args
from servelab.server.metrics import VLLM_METRICS

PROMPT = [5, 6, 7, 8, 9, 10, 11]


# ---- the command line -------------------------------------------------------------------------------
def test_vllm_flag_spellings_and_a_positional_model():
    args = parse_args(
        [
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--enable-prefix-caching",
            "--gpu-memory-utilization",
            "0.5",
            "--enforce-eager",
            "--num-gpu-blocks-override",
            "64",
        ]
    )
    assert args.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert args.prefix_caching and args.memory_fraction == 0.5 and args.num_blocks == 64
    assert not args.cuda_graphs and not args.step_graphs


def test_this_projects_spellings_still_work_and_the_default_model_stays():
    args = parse_args(["--model", "config:tiny-llama", "--prefix-caching", "--memory-fraction", "0.7"])
    assert (args.model, args.prefix_caching, args.memory_fraction) == ("config:tiny-llama", True, 0.7)
    assert args.cuda_graphs and args.step_graphs
    assert parse_args([]).model == "config:tiny-llama"
    assert parse_args(["config:tiny-llama", "--model", "config:tiny-llama"]).model == "config:tiny-llama"
    assert not parse_args(["--no-enable-prefix-caching"]).prefix_caching


def test_a_model_given_twice_differently_is_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["config:tiny-llama", "--model", "config:qwen2-0.5b"])
    assert "the model is given twice" in capsys.readouterr().err


def test_the_servelab_console_script(capsys):
    assert console_main([]) == 2 and "servelab serve" in capsys.readouterr().out
    assert console_main(["bogus"]) == 2 and "unknown command 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        console_main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: servelab serve") and "--enable-prefix-caching" in out and "MODEL" in out


# ---- endpoints --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    engine = Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        seed=0,
        config=EngineConfig(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512),
    )
    with ServerThread(engine, settings=ServerSettings(model_name="org/tiny")) as srv:
        yield srv


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def test_version(http):
    import servelab

    assert http.get("/version").json() == {"version": servelab.__version__}


def test_tokenize_and_detokenize_round_trip(http, server):
    r = http.post("/tokenize", json={"model": "org/tiny", "prompt": "héllo", "return_token_strs": True}).json()
    assert r["tokens"] == server.codec.encode("héllo") and r["count"] == len("héllo".encode())
    assert r["max_model_len"] == server.state.max_model_len and len(r["token_strs"]) == r["count"]
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "héllo"}


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}, 400),  # no chat template
        ("/tokenize", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, 400),
        ("/tokenize", {"prompt": "hi", "model": "other"}, 404),
        ("/detokenize", {"tokens": [10**6]}, 400),
        ("/detokenize", {"tokens": "abc"}, 400),
    ],
)
def test_tokenize_refuses_bad_input_in_openai_shape(http, path, body, status):
    r = http.post(path, json=body)
    assert r.status_code == status and r.json()["error"]["message"]


def test_a_model_by_id_with_a_slash_and_an_unknown_one(http):
    card = http.get("/v1/models/org/tiny").json()
    assert card["id"] == "org/tiny" and card["object"] == "model" and card["max_model_len"] > 0
    assert card == http.get("/v1/models").json()["data"][0] | {"created": card["created"]}
    r = http.get("/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# ---- metrics ----------------------------------------------------------------------------------------
def samples(text: str) -> dict[str, float]:
    """``name{labels}`` → value for every sample line."""
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            key, value = ln.rsplit(" ", 1)
            out[key] = float(value)
    return out


def idle_gauges(http, label: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The metrics once the engine thread has set its gauges after the last round. A response reaches the
    client inside the engine's step, before the round ends with the gauges, so a scrape at once may still
    read the round before (one block in use): that lag is the gauge's, not a leak, and a leak never settles."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = samples(http.get("/metrics").text)
        idle = now[f"servelab:kv_cache_usage_perc{label}"] == 0.0 and now[f"servelab:num_requests_running{label}"] == 0
        if idle or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def test_vllms_metric_set_under_the_servelab_prefix_with_a_model_name(http, server):
    before = samples(http.get("/metrics").text)
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    text = http.get("/metrics").text
    for name, kind in VLLM_METRICS.items():
        suffix = {"counter": "_total", "histogram": "_count", "gauge": ""}[kind]
        assert re.search(rf'^servelab:{name}{suffix}{{[^}}]*model_name="org/tiny"', text, re.M), name
    after = samples(text)
    label = '{model_name="org/tiny"}'

    def grew(name: str) -> float:
        return after[f"servelab:{name}{label}"] - before.get(f"servelab:{name}{label}", 0.0)

    assert grew("prompt_tokens_total") == len(PROMPT) and grew("generation_tokens_total") == 5
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert grew(hist + "_count") == 1, hist
    assert grew("inter_token_latency_seconds_count") == 4 and grew("request_time_per_output_token_seconds_count") == 1
    assert after['servelab:request_success_total{finished_reason="length",model_name="org/tiny"}'] >= 1
    idle = idle_gauges(http, label)
    assert idle[f"servelab:kv_cache_usage_perc{label}"] == 0.0  # idle: every block back
    assert idle[f"servelab:num_requests_running{label}"] == 0


def test_preemptions_are_counted():
    engine = Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        seed=0,
        config=EngineConfig(num_blocks=12, block_size=16, max_num_seqs=8, max_num_batched_tokens=512),
    )
    with ServerThread(engine, settings=ServerSettings(model_name="tiny")) as srv, httpx.Client(timeout=60) as c:
        body = {"prompt": [[5 + i] * 40 for i in range(4)], "max_tokens": 60, "ignore_eos": True}
        assert c.post(srv.base_url + "/v1/completions", json=body).status_code == 200
        got = samples(c.get(srv.base_url + "/metrics").text)['servelab:num_preemptions_total{model_name="tiny"}']
    assert got == engine.scheduler.num_preemptions > 0
