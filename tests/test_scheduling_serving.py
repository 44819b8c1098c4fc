"""The real loop on CPU: a tiny model served over HTTP (``PolicyServer``), its policy switched between runs,
driven by the load generator in its own process (``LoadWorker``); the step log lines up with the client's
records. Most tests serve in-process (fast); one runs the engine in its own process, Study 1's default."""

import math

import pytest

from servelab.errors import ParameterError
from servelab.loadgen.lengths import FixedLengths, UniformLengths
from servelab.loadgen.worker import LoadWorker
from servelab.loadgen.workload import Trace
from servelab.server.step_log import read_step_log
from servelab.studies.s01_scheduling.params import study_params
from servelab.studies.s01_scheduling.serving import WARMUP_PROMPT_TOKENS, PolicyServer, graph_sizes
from servelab.studies.s01_scheduling.sweep import Point, run_point, run_probe


def tiny_server(tmp, *, engine_process: bool) -> PolicyServer:
    return PolicyServer(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=256,
        num_blocks=128,
        step_log_path=tmp / "steps.jsonl",
        engine_process=engine_process,
    )


@pytest.fixture(scope="module")
def worker():
    with LoadWorker() as w:
        yield w


@pytest.fixture(scope="module")
def served(tmp_path_factory, worker):
    tmp = tmp_path_factory.mktemp("study01")
    with tiny_server(tmp, engine_process=False) as srv:
        yield srv, worker, tmp


def serve_under_two_policies(srv: PolicyServer, worker, tmp) -> dict:
    """Four 100-token prompts at once under EagerContBatch, then under ChunkedPrefill@32; each run's steps."""
    trace = Trace.synthetic(rate=math.inf, lengths=FixedLengths(100, 4), n=4).with_prompt_ids(srv.vocab)
    seen = {}
    for name, budget in (("eager_cont_batch", 256), ("chunked_prefill", 32)):
        srv.use_policy(name, budget)
        assert srv.policy == (name, budget) and srv.last_warmup_s > 0
        records, meta = worker.run(srv.base_url, trace, tmp, deadline_s=30, name=name)
        assert records["ok"].all() and (records["output_tokens"] == 4).all()
        srv.wait_idle()
        assert srv.idle_state() == {"unfinished": False, "waiting": 0, "running": 0, "used_blocks": 0}
        t0 = meta["t0_perf_s"]
        steps = srv.steps_between(t0, t0 + 30)
        seen[name] = steps
        # the client's first token comes after the step that prefilled it ended (one clock for both)
        assert records["first_token_s"].min() >= steps["end_s"].min() - t0 - 1e-3
        # the warm-up request ran under the new policy and ended before the run's clock started
        log = read_step_log(srv.step_log_path)
        before = log[log["start_s"] < t0]
        assert before["end_s"].max() < t0 and (before["prefill_tokens"] == WARMUP_PROMPT_TOKENS).any()
    return seen


def check_batch_shapes(seen: dict) -> None:
    eager, chunked = seen["eager_cont_batch"], seen["chunked_prefill"]
    assert eager["prefill_tokens"].max() >= 200  # whole prompts, several at once
    assert ((eager["prefill_tokens"] > 0) & (eager["decode_tokens"] > 0)).sum() == 0  # decodes paused
    # exactly the run's 400 prompt tokens in its window: the warm-up's prefill is not in it
    assert eager["prefill_tokens"].sum() == 400
    assert chunked["prefill_tokens"].max() <= 32 and chunked["prefill_tokens"].sum() == 400


def test_policy_switch_changes_batch_composition(served):
    srv, worker, tmp = served
    assert srv.engine is not None and srv.engine_child is None  # in this process
    check_batch_shapes(serve_under_two_policies(srv, worker, tmp))


def test_engine_process_serves_switches_policy_and_exits(tmp_path, worker):
    import os

    with tiny_server(tmp_path, engine_process=True) as srv:
        child = srv.engine_child
        assert srv.engine is None and child.is_alive() and child.pid != os.getpid()
        assert srv.vocab == 512 and srv.stats["num_blocks"] == 128 and srv.shape.layers > 0
        check_batch_shapes(serve_under_two_policies(srv, worker, tmp_path))
        assert srv.alive and srv.error == ""
    assert not child.is_alive() and child.exitcode == 0  # drained and exited with the server
    assert not srv.alive


def test_bad_budget_policy_and_worker_job(served):
    srv, worker, tmp = served
    trace = Trace.synthetic(rate=1, lengths=FixedLengths(4, 2), n=1).with_prompt_ids(srv.vocab)
    with pytest.raises(RuntimeError, match="base_url"):
        worker.run("ftp://nowhere", trace, tmp, deadline_s=1)  # the worker answers the error, stays up
    records, _ = worker.run(srv.base_url, trace, tmp, deadline_s=30)
    assert records["ok"].all()
    with pytest.raises(ParameterError, match="budget"):
        srv.use_policy("chunked_prefill", 512)  # above the engine's planned step
    with pytest.raises(ParameterError, match="unknown scheduling policy"):
        srv.use_policy("lifo", 64)


def test_probe_and_point_rows(served):
    srv, worker, tmp = served
    P = study_params(
        "smoke",
        probe_requests=4,
        min_requests=5,
        point_cap_s=0.6,
        drain_s=3.0,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=256,
        prompt_max=120,
        output_max=8,
        policies=[["eager_cont_batch", None], ["chunked_prefill", 32]],
        budget_sweep=[],
        reference_budget=32,
    )
    lengths = UniformLengths(20, 120, 2, 8)
    est = run_probe(srv, worker, P, lengths, tmp, batch=8)
    assert est.capacity_req_s > 0 and est.prefill_s_per_token > 0
    pt = Point("config:tiny-llama", "chunked_prefill", 32, 0.5, "rate", seed=1, rate=10.0)
    req, steps, row = run_point(srv, worker, pt, P, lengths, tmp, slo_itl_ms=50.0)
    assert row["status"] == "ok" and row["requests"] == len(req) > 0 and row["completed"] == len(req)
    assert {"model", "scheduler", "budget", "rate", "token_times_s", "t0_perf_s"} <= set(req.columns)
    assert steps["start_s"].min() >= 0 and steps["prefill_tokens"].max() <= 32  # on the records' axis
    # the step log's times as written: seconds to the microsecond, phase times to a tenth of one (ms to 4 places)
    for col, digits in {"start_s": 6, "end_s": 6, "host_ms": 4, "wait_ms": 4}.items():
        kept = steps[col].dropna()
        assert len(kept) and (kept == kept.round(digits)).all(), col
        assert (kept != kept.round(digits - 2)).any(), col  # and no coarser: some value uses the last places
    assert row["delivered_tok_s"] > 0 and row["slo_itl_ms"] == 50.0
    # the window: min_requests × 1.15 / 10 req/s = 0.575 s (under the 0.6 s cap), so 6 requests, all completed
    assert row["window_s"] == pytest.approx(0.575) and row["requests"] == 6 and row["shortfall"] == 0
    # the last of the 6 arrivals comes at 0.90 s, past the window: the deadline still leaves it the whole drain (a
    # deadline of window + drain left it 2.67 s of 3, and a request arriving after it was never sent, yet cut)
    last = req["arrival_s"].max()
    assert last > row["window_s"] and row["deadline_s"] == pytest.approx(last + P["drain_s"])
    assert row["stall_requests"] == row["completed"] and row["max_itl_p99_ms"] <= row["max_itl_ms"]
    assert row["max_itl_p99_lo_ms"] <= row["max_itl_p99_ms"] <= row["max_itl_p99_hi_ms"]


def test_graph_sizes():
    assert graph_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_sizes(6) == (1, 2, 4, 6)


def test_a_model_that_cannot_load_is_recorded_not_raised(tmp_path):
    from servelab.studies.s01_scheduling.sweep import run_study

    P = study_params("smoke", budget_sweep=[], engine_process=False)  # in-process: no interpreter to spawn
    data = run_study(
        P,
        tmp_path,
        device="cuda:99" if not __import__("torch").cuda.is_available() else "meta",
        progress=False,
        log=lambda *_: None,
    )
    f = data.frames()
    assert (f["summary"]["status"] == "error: server did not start").all()
    assert len(f["summary"]) == len(P["policies"]) * len(P["rate_fractions"])
    assert f["servers"]["status"].str.startswith("error").all() and f["requests"].empty


@pytest.mark.skipif(
    not __import__("os").environ.get("SERVELAB_SLOW_TESTS"),
    reason="spawns a fresh interpreter (torch imports: 10-25 s on 2 cores); set SERVELAB_SLOW_TESTS=1",
)
def test_an_engine_process_that_cannot_load_is_recorded_not_raised(tmp_path):
    from servelab.studies.s01_scheduling.sweep import run_study

    P = study_params("smoke", budget_sweep=[], engine_process=True)
    data = run_study(
        P,
        tmp_path,
        device="cuda:99" if not __import__("torch").cuda.is_available() else "meta",
        progress=False,
        log=lambda *_: None,
    )
    servers = data.frames()["servers"]
    assert servers["engine_process"].all() and servers["status"].str.contains("EngineStartError").all()
    assert (data.frames()["summary"]["status"] == "error: server did not start").all()
