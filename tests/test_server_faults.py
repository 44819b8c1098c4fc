"""Issue 20's four bugs, each pinned by a test that failed before its fix (tiny model, CPU, loopback).

1. Queue slots leaked (refused batches, aborts before admission) until every request got 429, while
   ``/metrics`` showed 0 waiting; the 429 counted the request's own prompts as waiting.
2. One request whose sampling underflowed (``top_p`` 1e-300, ``temperature`` 1e-40) failed every stream in
   flight; a lone ``temperature`` 1e-300 gave token 0 instead of the greedy token.
3. The engine process ignored SIGTERM (and outlived a SIGKILLed server: ``test_server_fault_injection.py``).
4. A second Ctrl-C left the server waiting on the engine (for the whole drain timeout).

The engine process's bookkeeping is tested in this process: its code (``engine_process_main``) runs on a
thread at the other end of a real pipe, which exercises both sides' accounting without a fresh interpreter.
"""

import asyncio
import json
import multiprocessing
import signal
import threading
import time

import httpx
import psutil
import pytest

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.server import ServerProcess, ServerThread
from servelab.server.app import ServerSettings
from servelab.server.engine_process import EngineProcess, engine_process_main


def tiny_engine(num_blocks: int = 256) -> Engine:
    return Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        seed=0,
        config=EngineConfig(num_blocks=num_blocks, max_num_seqs=64, max_num_batched_tokens=512),
    )


def wait_for(condition, timeout_s: float = 10.0, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def metric(text: str, name: str) -> float:
    return next(
        float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ") or ln.startswith(name + "{")
    )


class ThreadChild:
    """Stands in for the engine process: ``engine_process_main`` on a thread of this process."""

    def __init__(self, thread: threading.Thread):
        self.thread, self.pid, self.exitcode = thread, None, None

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout=None) -> None:
        self.thread.join(timeout)

    def kill(self) -> None:
        pass

    terminate = kill


@pytest.fixture
def engine_process(monkeypatch):
    """``make(engine, max_waiting)``: an ``EngineProcess`` whose child is a thread here (ready, not started)."""
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the child's handlers: the main thread's business
    made = []

    def make(engine, max_waiting=None):
        parent, child = multiprocessing.Pipe()
        t = threading.Thread(target=engine_process_main, args=(child, lambda: engine, None), daemon=True)
        t.start()
        ep = EngineProcess(lambda: engine, max_waiting=max_waiting)
        ep._conn, ep.proc = parent, ThreadChild(t)
        kind, info = parent.recv()
        assert kind == "ready"
        ep.info, ep.vocab, ep.max_model_len = info, info["vocab"], info["max_model_len"]
        made.append(ep)
        return ep

    yield make
    for ep in made:
        ep.drain(5.0)


# ---- 1. queue slots -------------------------------------------------------------------------------------
def test_aborts_before_admission_give_their_queue_slots_back(engine_process):
    engine = tiny_engine()
    ep = engine_process(engine, max_waiting=1000).start()
    for _ in range(300):  # submit then abort at once: most aborts reach the engine before the request is admitted
        ep.abort(ep.submit([5, 6, 7], SamplingParams(max_tokens=4), lambda update: None))
    assert wait_for(lambda: ep.num_waiting == 0), f"{ep.num_waiting} of 300 queue slots leaked"
    assert wait_for(lambda: engine.block_manager.num_used_blocks == 0)


def test_a_refused_batch_leaves_nothing_behind_and_the_429_counts_only_others(engine_process):
    engine = tiny_engine()
    ep = engine_process(engine, max_waiting=32)
    with ServerThread(ep, settings=ServerSettings(model_name="tiny", max_waiting=32)) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            # 64 free running slots and 32 places to wait beyond them: a batch of 97 cannot fit
            for _ in range(2):
                r = c.post("/v1/completions", json={"prompt": ["hi"] * 97, "max_tokens": 1})
                assert r.status_code == 429
                message = r.json()["error"]["message"]
                assert "0 requests are waiting" in message and "97 prompts" in message, message
            assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).status_code == 200
            assert c.post("/v1/completions", json={"prompt": ["hi"] * 96, "max_tokens": 1}).status_code == 200
            assert c.get("/health").status_code == 200
            text = c.get("/metrics").text
            assert metric(text, "servelab_num_requests_waiting") == 0
            assert metric(text, "servelab:num_requests_waiting") == 0
        assert ep.num_waiting == 0


# ---- 2. one request's sampling cannot fail the others -------------------------------------------------
@pytest.fixture(scope="module")
def sampling_server():
    engine = tiny_engine()
    greedy = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    with ServerThread(engine, settings=ServerSettings(model_name="tiny")) as srv:
        yield srv, greedy


async def _stream(client: httpx.AsyncClient, extra: dict) -> tuple[int, list, list]:
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 12, "ignore_eos": True, "stream": True, "return_token_ids": True}
    async with client.stream("POST", "/v1/completions", json=body | extra) as r:
        events = [json.loads(ln[6:]) for ln in [ln async for ln in r.aiter_lines()] if ln.startswith("data: {")]
    tokens = [t for e in events if "choices" in e for c in e["choices"] for t in c["token_ids"]]
    return r.status_code, tokens, [e for e in events if "error" in e]


@pytest.mark.parametrize(
    "bad",
    [{"temperature": 1.0, "top_p": 1e-300}, {"temperature": 1e-40, "top_p": 0.9}, {"temperature": 1e-300, "seed": 3}],
    ids=["top_p_1e-300", "temperature_1e-40_top_p", "temperature_1e-300_seed"],
)
def test_a_request_whose_sampling_underflows_fails_no_stream(sampling_server, bad):
    srv, greedy = sampling_server

    async def main():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
            others = [{"temperature": 1.0, "top_p": 0.9}] * 4 + [{"temperature": 0}] * 2
            return await asyncio.gather(*[_stream(c, extra) for extra in [bad, *others]])

    results = asyncio.run(main())
    for status, tokens, errors in results:
        assert status == 200 and not errors and len(tokens) == 12, (status, errors)
    assert results[0][1] == greedy  # the bad request itself is greedy (top_p that small keeps the top token)


def test_a_lone_tiny_temperature_is_greedy(sampling_server):
    srv, greedy = sampling_server
    status, tokens, errors = asyncio.run(_lone(srv.base_url, {"temperature": 1e-300}))
    assert status == 200 and not errors and tokens == greedy


async def _lone(base_url: str, extra: dict):
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        return await _stream(c, extra)


def test_a_failed_step_fails_its_requests_and_the_engine_serves_on(sampling_server, monkeypatch):
    srv, greedy = sampling_server
    engine = srv.engine
    launch = engine.runner.launch  # every step goes through it, with async scheduling on or off
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected step failure")
        return launch(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "launch", fail_once)
    status, tokens, errors = asyncio.run(_lone(srv.base_url, {"temperature": 0}))
    assert status == 200 and len(tokens) < 12 and "injected step failure" in errors[0]["error"]["message"]
    assert wait_for(lambda: engine.block_manager.num_used_blocks == 0)
    status, tokens, errors = asyncio.run(_lone(srv.base_url, {"temperature": 0}))
    assert status == 200 and not errors and tokens == greedy
    assert httpx.get(srv.base_url + "/health").status_code == 200


# ---- 3 and 4: signals (a real server process) ---------------------------------------------------------
def gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def engine_child(server: ServerProcess) -> psutil.Process:
    (child,) = psutil.Process(server.proc.pid).children()
    return child


def start_long_stream(base_url: str, out: dict) -> threading.Thread:
    """A stream that would run for minutes; ``out`` gets its status, data lines and any client error."""
    body = {"prompt": [5, 6, 7], "max_tokens": 4000, "ignore_eos": True, "stream": True}

    def run():
        try:
            with httpx.Client(base_url=base_url, timeout=30) as c, c.stream("POST", "/v1/completions", json=body) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        out.setdefault("lines", []).append(line)
        except httpx.HTTPError as e:
            out["client_error"] = repr(e)
        out["ended_s"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert wait_for(lambda: len(out.get("lines", [])) >= 3, 60), out
    return t


def ended_with_an_error(out: dict) -> bool:
    """A stream that did not finish ends with an error event or a closed connection, never silently."""
    lines = out.get("lines", [])
    return "client_error" in out or any('"error"' in ln for ln in lines)


def test_sigterm_ends_the_engine_process_and_health_says_so():
    with ServerProcess("config:tiny-llama", extra_args=["--num-blocks", "512"], startup_timeout_s=300) as srv:
        engine = engine_child(srv)
        out: dict = {}
        stream = start_long_stream(srv.base_url, out)
        engine.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert wait_for(lambda: gone(engine.pid), 5.0), "the engine process ignored SIGTERM"
        with httpx.Client(base_url=srv.base_url, timeout=5) as c:
            assert wait_for(lambda: c.get("/health").status_code == 503, 2.0)
            assert time.monotonic() - t0 < 2.5
            r = c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})
            assert r.status_code == 503, r.text
        stream.join(10)
        assert not stream.is_alive() and ended_with_an_error(out), out


def test_a_second_ctrl_c_stops_at_once():
    args = ["--num-blocks", "512", "--drain-timeout", "120"]
    srv = ServerProcess("config:tiny-llama", extra_args=args, startup_timeout_s=300).start()
    try:
        engine = engine_child(srv)
        out: dict = {}
        stream = start_long_stream(srv.base_url, out)
        srv.proc.send_signal(signal.SIGINT)  # drain: the running stream would get two minutes
        time.sleep(1.0)  # uvicorn has closed its socket: the drain shows as a process still running
        assert srv.proc.poll() is None and stream.is_alive()
        srv.proc.send_signal(signal.SIGINT)  # stop now
        t0 = time.monotonic()
        srv.proc.wait(15)
        assert time.monotonic() - t0 < 10, "the second Ctrl-C did not stop the server promptly"
        assert wait_for(lambda: gone(engine.pid), 5.0)
        stream.join(10)
        assert not stream.is_alive() and ended_with_an_error(out), out
    finally:
        srv.stop()
