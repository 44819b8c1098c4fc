"""Data-parallel serving (``servelab.cluster``): replicas behind a router, on CPUs.

The unit tests check the router's parts; one test starts ``servelab serve --data-parallel-size 2`` on the CPU as a
user would, serves through both replicas, kills one in the middle of a stream and checks that its client gets an
error event while the other replica keeps serving, then stops the server with SIGINT."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from servelab.cluster.pool import ReplicaPool, prompt_key
from servelab.cluster.replica import NO_MULTICAST, Replica, child_env, replica_argv
from servelab.cluster.router_app import with_replica_label
from servelab.server.flags import ROUTER_NAMES, parse_args
from servelab.server.launch import LIB_DIR, free_port, wait_healthy
from servelab.sim.routers import ROUTERS


def test_router_names_match_the_simulators():
    assert ROUTER_NAMES == ROUTERS
    args = parse_args(["config:tiny-llama", "-dp", "4", "--router", "prefix_affinity"])
    assert args.data_parallel_size == 4 and args.router == "prefix_affinity"
    assert parse_args([]).data_parallel_size == 1


def test_replicas_get_every_flag_but_the_routers():
    argv = ["config:tiny-llama", "--data-parallel-size", "2", "--router=round_robin", "--port", "9000",
            "--host", "0.0.0.0", "--max-num-seqs", "8", "-dp=2", "--api-key", "k"]  # fmt: skip
    assert replica_argv(argv) == ["config:tiny-llama", "--max-num-seqs", "8", "--api-key", "k"]


def test_every_replica_runs_without_nvlink_multicast():
    env = child_env("1")
    assert {k: env[k] for k in NO_MULTICAST} == NO_MULTICAST and env["CUDA_VISIBLE_DEVICES"] == "1"


class _Proc:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


def _pool(router: str, n: int = 3) -> ReplicaPool:
    reps = [Replica(i, [], port=1000 + i) for i in range(n)]
    for r in reps:
        r.proc = _Proc()
    return ReplicaPool(reps, router)


def test_round_robin_skips_a_replica_out_of_rotation():
    pool = _pool("round_robin")
    assert [pool.choose({}).index for _ in range(4)] == [0, 1, 2, 0]
    pool.replicas[1].proc = _Proc(-9)  # its process died
    assert [pool.choose({}).index for _ in range(4)] == [0, 2, 0, 2]
    for r in pool.replicas:
        r.down = True
    assert pool.choose({}) is None


def test_least_outstanding_and_prefix_affinity_read_the_live_state():
    pool = _pool("least_outstanding")
    pool.replicas[0].outstanding, pool.replicas[1].outstanding = 3, 1
    assert pool.choose({}).index == 2
    aff = _pool("prefix_affinity")
    a = {"prompt": "You are a helpful assistant. " * 4 + "Question one?"}
    b = {"prompt": "You are a helpful assistant. " * 4 + "Another question"}
    assert prompt_key(a) == prompt_key(b) != prompt_key({"prompt": "Something else entirely, at length."})
    assert aff.choose(a).index == aff.choose(b).index
    assert prompt_key({"prompt": list(range(40))}) == prompt_key({"prompt": [list(range(32)) + [7]]})
    home = aff.choose(a)
    home.outstanding = 50  # far above the others: the load-aware fallback sends the request elsewhere
    assert aff.choose(a).index != home.index


def test_replica_metrics_get_a_replica_label():
    text = '# HELP x_total x\n# TYPE x_total counter\nx_total 3.0\ny_bucket{le="0.1"} 2.0\n'
    assert with_replica_label(text, 1, keep_meta=True) == [
        "# HELP x_total x",
        "# TYPE x_total counter",
        'x_total{replica="1"} 3.0',
        'y_bucket{replica="1",le="0.1"} 2.0',
    ]
    assert with_replica_label(text, 2, keep_meta=False)[0] == 'x_total{replica="2"} 3.0'


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _sse(text: str) -> list:
    return [json.loads(x[6:]) for x in text.split("\n\n") if x.startswith("data: {")]


def test_two_replicas_on_cpus_serve_and_survive_one_dying():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LIB_DIR), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "servelab.server", "config:tiny-llama", "--device", "cpu", "--max-num-seqs", "4",
           "--data-parallel-size", "2", "--router", "round_robin", "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    body = {"model": "config:tiny-llama", "prompt": [1, 2, 3], "max_tokens": 4}
    try:
        wait_healthy(url, 240, alive=lambda: proc.poll() is None)
        with httpx.Client(base_url=url, timeout=60) as c:
            served = [c.post("/v1/completions", json=body) for _ in range(4)]
            assert [r.status_code for r in served] == [200] * 4
            assert sorted(r.headers["x-servelab-replica"] for r in served) == ["0", "0", "1", "1"]
            assert [r.json()["usage"]["completion_tokens"] for r in served] == [4] * 4
            metrics = c.get("/metrics").text
            assert 'servelab_router_requests_total{replica="1"} 2.0' in metrics
            assert 'replica="0"' in metrics and "servelab_kv_blocks_total{replica=" in metrics
            pids = {r["replica"]: r["pid"] for r in c.get("/health").json()["replicas"]}
            long = {**body, "max_tokens": 4000, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=long) as s:
                victim = int(s.headers["x-servelab-replica"])
                it = s.iter_text()
                first = next(it)
                os.kill(pids[victim], signal.SIGKILL)
                raw = first + "".join(it)
                events = _sse(raw)
            assert events and "error" in events[-1], raw[-600:]
            assert events[-1]["error"]["code"] == "replica_failed"
            after = [c.post("/v1/completions", json=body) for _ in range(3)]
            assert [r.status_code for r in after] == [200] * 3
            assert {r.headers["x-servelab-replica"] for r in after} == {str(1 - victim)}
            health = c.get("/health").json()["replicas"]
            assert [r["up"] for r in health] == [i != victim for i in range(2)] and health[victim]["failed"] == 1
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
        assert _gone(pids[1 - victim])  # the surviving replica was drained and stopped with the router
    finally:
        if proc.poll() is None:
            proc.kill()
