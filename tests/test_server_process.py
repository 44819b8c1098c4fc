"""``python -m servelab.server`` as a process (``ServerProcess``), and graceful shutdown (drain)."""

import functools
import json
import os
import signal
import sys
import threading
import time

import httpx
import openai
import pytest

from servelab.engine import Engine, EngineConfig
from servelab.server import ServerProcess, ServerStartError, ServerThread
from servelab.server.cli import engine_config_from_args, parse_args
from servelab.server.engine_process import EngineProcess
from servelab.server.step_log import read_step_log


def stream_all(base_url: str, body: dict, first_chunk: threading.Event, out: dict) -> None:
    """POST a streaming completion and keep every SSE data line in ``out["lines"]``."""
    try:
        with httpx.Client(base_url=base_url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.setdefault("lines", []).append(line)
                    first_chunk.set()
    except Exception as e:  # noqa: BLE001 - the assertion in the test reports it
        out["error"] = repr(e)
    finally:
        first_chunk.set()


def token_count(lines) -> int:
    return sum(len(json.loads(ln[6:])["choices"][0]["token_ids"]) for ln in lines[:-1] if json.loads(ln[6:])["choices"])


def gauge(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " "))


def wait_for(condition, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cli_flags_build_the_engine_config():
    args = parse_args(
        [
            "--model",
            "config:tiny-llama",
            "--scheduler",
            "fcfs",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "512",
            "--num-blocks",
            "64",
            "--block-size",
            "32",
            "--no-cuda-graphs",
            "--graph-batch-sizes",
            "1,2,4",
            "--max-model-len",
            "1024",
        ]
    )
    cfg = engine_config_from_args(args)
    assert (
        cfg.scheduler,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.num_blocks,
        cfg.block_size,
        cfg.cuda_graphs,
        cfg.graph_batch_sizes,
        cfg.max_model_len,
    ) == ("fcfs", 8, 512, 64, 32, False, (1, 2, 4), 1024)
    assert args.host == "127.0.0.1"  # loopback unless asked


@pytest.mark.parametrize(
    "argv",
    [
        ["--scheduler", "lottery"],
        ["--max-num-seqs", "0"],
        ["--port", "70000"],
        ["--graph-batch-sizes", "1,x"],
        ["--memory-fraction", "1.5"],
        ["--max-num-seqs", "64", "--max-num-batched-tokens", "32"],
    ],
)
def test_bad_flags_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_server_process_that_dies_raises_with_its_log(tmp_path):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\necho 'model failed to load: boom' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ServerStartError, match="(?s)exit code 3.*boom"):
        ServerProcess(python=str(fake), startup_timeout_s=30).start()


def test_server_process_serves_logs_steps_and_drains_on_sigterm(tmp_path):
    steps = tmp_path / "steps.jsonl"
    with ServerProcess(
        "config:tiny-llama",
        scheduler="eager_cont_batch",
        startup_timeout_s=180,
        extra_args=[
            "--num-blocks",
            "256",
            "--max-num-batched-tokens",
            "1024",
            "--step-log",
            steps,
            "--served-model-name",
            "tiny",
        ],
    ) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        r = client.completions.create(
            model="tiny", prompt="ping", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 5
        # the engine's own refusal (EagerContBatch cannot prefill 1100 tokens in a 1024-token step) crosses the
        # process boundary as a 400
        with pytest.raises(openai.BadRequestError, match="max_num_batched_tokens"):
            client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=1100)
        # the engine runs in its own process: a client that goes away must still free its blocks there
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            long = {"prompt": [5, 6, 7], "max_tokens": 1000, "ignore_eos": True, "stream": True}  # within the budget
            with c.stream("POST", "/v1/completions", json=long) as resp:
                assert resp.status_code == 200
                chunks = (ln for ln in resp.iter_lines() if ln.startswith("data: "))
                assert len([next(chunks) for _ in range(3)]) == 3
                assert gauge(c, "servelab_kv_blocks_used") > 0
            assert wait_for(
                lambda: gauge(c, "servelab_kv_blocks_used") == 0 and gauge(c, "servelab_num_requests_running") == 0
            )
        # SIGTERM while a long stream runs: the stream must still end normally
        first, out = threading.Event(), {}
        body = {
            "prompt": [5, 6, 7],
            "max_tokens": 300,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        t = threading.Thread(target=stream_all, args=(srv.base_url, body, first, out))
        t.start()
        assert first.wait(60)
        os.kill(srv.proc.pid, signal.SIGTERM)
        t.join(120)
        assert srv.proc.wait(60) == 0, srv.log()
    assert "error" not in out, out.get("error")
    assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]"
    assert token_count(out["lines"]) == 300
    log = read_step_log(steps)
    assert log.decode_tokens.sum() >= 5 + 300 - 2 and log.prefill_tokens.sum() >= 4 + 3
    assert (log.end_s >= log.start_s).all() and log.start_s.is_monotonic_increasing


def test_draining_server_refuses_new_requests_and_finishes_running_ones():
    engine = Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        config=EngineConfig(num_blocks=128, max_num_batched_tokens=1024),
    )
    srv = ServerThread(engine).start()
    first, out = threading.Event(), {}
    body = {
        "prompt": [9, 8, 7],
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    t = threading.Thread(target=stream_all, args=(srv.base_url, body, first, out))
    t.start()
    assert first.wait(30)
    srv.state.loop.begin_drain()  # what SIGTERM does first
    with httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert c.get("/health").status_code == 503
    srv.stop(timeout_s=60)
    t.join(60)
    assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]" and token_count(out["lines"]) == 400
    assert not srv.state.loop.alive and engine.block_manager.num_used_blocks == 0


if sys.platform == "win32":  # pragma: no cover - signals and fork semantics differ
    pytestmark = pytest.mark.skip("POSIX only")


def set_policy(loop, name: str, budget: int):
    """Swap the engine's scheduling policy (run in the engine process, between steps)."""
    eng = loop.engine
    eng.set_policy(name, budget)
    return type(eng.scheduler).__name__, eng.scheduler.max_num_batched_tokens


def fail(loop):
    raise ValueError("as asked")


@pytest.mark.skipif(
    not os.environ.get("SERVELAB_SLOW_TESTS"),
    reason="spawns a fresh interpreter (torch imports: 10-25 s on 2 cores); set SERVELAB_SLOW_TESTS=1",
)
def test_engine_process_behind_a_server_thread_switches_policy_between_runs(tmp_path):
    build = functools.partial(
        Engine.from_spec,
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        config=EngineConfig(num_blocks=128, max_num_batched_tokens=1024),
    )
    ep = EngineProcess(build, step_log_path=str(tmp_path / "steps.jsonl"))
    info = ep.launch(timeout_s=180)
    assert info["vocab"] == 512
    assert info["gc_frozen"] > 10_000  # the built engine's heap, frozen in its process (server/heap.py)
    with ServerThread(ep) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        body = dict(
            model="servelab",
            prompt=[5, 6, 7],
            max_tokens=6,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        first = client.completions.create(**body).choices[0].model_extra["token_ids"]
        assert ep.call(set_policy, "fcfs", 512) == ("FCFS", 512)
        again = client.completions.create(**body).choices[0].model_extra["token_ids"]
        assert again == first and len(first) == 6  # greedy output does not depend on the policy
        with pytest.raises(RuntimeError, match="as asked"):
            ep.call(fail)
        with httpx.Client(base_url=srv.base_url) as c:
            assert gauge(c, "servelab_kv_blocks_total") == 128
            assert gauge(c, "servelab_time_to_first_token_seconds_count") == 2
    assert wait_for(lambda: not ep.proc.is_alive())
    steps = read_step_log(tmp_path / "steps.jsonl")
    assert steps.decode_tokens.sum() == 2 * 5 and steps.prefill_tokens.sum() == 2 * 3
