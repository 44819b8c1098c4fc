"""A tensor parallel engine (``tp_engine.engine_from_spec(..., tensor_parallel_size=2)``, issue 31) on two CPU
processes over gloo, float32: requests that arrive and leave mid-run give one process's greedy tokens, every rank
samples what the driver samples, bad input is refused before any rank sees it, a rank that dies ends the engine with
an error instead of a hang, and ``servelab serve --tensor-parallel-size 2`` answers."""

import os
import subprocess
import sys
import time

import httpx
import pytest

from servelab.engine import EngineConfig, SamplingParams
from servelab.engine.tp_engine import engine_from_spec
from servelab.errors import ParameterError

PROMPTS = [[5, 9, 2, 7, 11, 3, 8], [4, 4, 6], list(range(1, 40))]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
CONFIG = dict(num_blocks=64, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64)


def _engine(world: int, spec: str = "config:tiny-llama", **kw):
    extra = {"timeout_s": 60} if world > 1 else {}
    return engine_from_spec(
        spec, dtype="float32", device="cpu", config=EngineConfig(**CONFIG, **kw), tensor_parallel_size=world, **extra
    )


@pytest.fixture
def tp2():
    engine = _engine(2)
    yield engine
    engine.close()


def _arrivals_and_an_abort(engine) -> dict[int, list[int]]:
    """Two requests, a third after two steps, the first aborted after four: the tokens of the other two."""
    seqs = [engine.add_request(p, GREEDY) for p in PROMPTS[:2]]
    for i in range(4):
        if i == 2:
            seqs.append(engine.add_request(PROMPTS[2], GREEDY))
        engine.step()
    assert engine.abort(seqs[0])
    while engine.has_unfinished():
        engine.step()
    return {i: list(s.output_token_ids) for i, s in enumerate(seqs) if i}


def test_requests_that_arrive_and_leave_mid_run_give_one_process_tokens(tp2):
    one = _engine(1)
    assert _arrivals_and_an_abort(tp2) == _arrivals_and_an_abort(one)
    assert tp2.leaked() == [] and tp2.stats()["tensor_parallel_size"] == 2
    # the same engine serves on, with the prefix cache switched on on every rank
    tp2.set_prefix_caching(True)
    assert tp2.generate(PROMPTS, GREEDY) == one.generate(PROMPTS, GREEDY)


def test_every_rank_samples_what_the_driver_samples(tp2):
    """Unseeded sampled requests get a seed from the driver, so each rank draws the same tokens; checked after every
    step against each worker's copies (a rank that drew otherwise would also schedule otherwise)."""
    import torch

    torch.manual_seed(1234)  # as ``servelab serve --seed`` does in the driver's process only
    params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    seqs = [tp2.add_request(p, params) for p in PROMPTS]
    steps = 0
    while tp2.has_unfinished():
        tp2.step()
        steps += 1
        running = {s.seq_id: list(s.output_token_ids) for s in seqs if not s.is_finished}
        assert tp2.rank_outputs() == [running]
    assert steps > 10 and all(len(s.output_token_ids) == 12 for s in seqs)
    assert len({tuple(s.output_token_ids) for s in seqs}) == 3


def test_bad_input_is_refused_before_any_rank_sees_it(tp2):
    with pytest.raises(ParameterError, match="vocab"):
        tp2.add_request([10**7], GREEDY)
    assert tp2.generate(PROMPTS[:1], GREEDY) == _engine(1).generate(PROMPTS[:1], GREEDY)


def test_settings_that_cannot_split_are_refused():
    for bad in (0, 1.5, True):
        with pytest.raises(ParameterError, match="tensor_parallel_size must be a positive integer"):
            engine_from_spec("config:tiny-llama", device="cpu", tensor_parallel_size=bad)
    with pytest.raises(ParameterError, match="must divide the attention heads"):
        _engine(3)  # 4 heads


def test_a_rank_that_dies_ends_the_engine_with_an_error_not_a_hang():
    engine = _engine(2)
    try:
        engine._procs[0].kill()
        engine._procs[0].wait()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="rank 1"):
            engine.generate(PROMPTS, GREEDY)
        assert time.monotonic() - t0 < 60
    finally:
        engine.close()


def test_the_server_serves_a_model_split_over_two_processes(tmp_path):
    """``servelab serve --tensor-parallel-size 2`` on CPUs: the engine process (a daemon) starts its worker, and a
    completion gives one process's greedy tokens."""
    from servelab.engine.tensor_parallel import free_port

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "servelab.server", "config:tiny-llama", "--port", str(port), "--device", "cpu",
           "--dtype", "float32", "--num-blocks", "64", "--max-model-len", "256", "-tp", "2"]  # fmt: skip
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            got = _complete(proc, port, tmp_path / "server.log")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert got["token_ids"] == _engine(1).generate(PROMPTS[:1], GREEDY)[0]


def _complete(proc, port: int, log) -> dict:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for _ in range(240):
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        body = {"model": "config:tiny-llama", "prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]
