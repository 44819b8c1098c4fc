"""The simulator replays a real replicas run's points on their own traces (``s08_simulator.cluster_replay``). Here
the "real" run is itself a simulation of the re-drawn trace, so a replay that reads the run right (its send times,
the output lengths asked for, the prompt ids the router keys on, the deadline, the router) gives it back exactly;
a wrong router or cost model does not."""

import dataclasses
import json
import math

import pandas as pd
from sim_fixtures import COST

from servelab.cluster import capacity_run
from servelab.loadgen.metrics import summarize
from servelab.sim.capacity import meets_slo
from servelab.sim.simulator import simulate
from servelab.studies.s08_simulator import cluster_replay, validation

SCHED = {"scheduler": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": 16}
POINTS = [(capacity_run.SINGLE, 1, 20.0), ("prefix_affinity", 2, 40.0), ("prefix_affinity", 2, 400.0)]


def _params():
    a = capacity_run.build_parser().parse_args([
        "m", "--slo-ttft-ms", "200", "--slo-tpot-ms", "3", "--start", "20", "--requests-per-replica", "30",
        "--lengths", "uniform", "--prompt-range", "50", "150", "--output-range", "10", "30", "--prefix-groups", "4",
        "--prefix-tokens", "32", "--drain-s", "2", "--seed", "3", "--repeat", "1",
    ])  # fmt: skip
    return vars(a) | {"out": None}


def _run(tmp_path, cost=COST, router_as_run=None):
    P = _params()
    frames, points = [], []
    for router, n, rate in POINTS:
        trace = capacity_run.point_trace(P, n, rate)
        policy = router_as_run or ("round_robin" if router == capacity_run.SINGLE else router)
        sim = simulate(trace, cost=cost, replicas=n, router=policy, **SCHED)
        rec = validation.cut_at(sim.records.drop(columns="replica"), trace.duration_s + P["drain_s"])
        s = summarize(rec, slo_ttft_ms=P["slo_ttft_ms"], slo_tpot_ms=P["slo_tpot_ms"])  # as measure_point does
        points.append({"router": router, "replicas": n, "rate": rate, "met": meets_slo(s, 200.0, 3.0), **s})
        frames.append(capacity_run.compact(rec).assign(router=router, replicas=n, rate=rate))
    run = tmp_path / "r1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"params": P}, default=str))
    pd.concat(frames, ignore_index=True).to_csv(run / "requests.csv", index=False)
    pd.DataFrame(points).to_csv(run / "points.csv", index=False)
    return run


def test_a_run_the_simulator_made_is_replayed_exactly_point_by_point(tmp_path):
    table = cluster_replay.replay_run(_run(tmp_path), COST, SCHED)
    assert sorted(set(zip(table["router"], table["replicas"], table["rate"], strict=True))) == sorted(POINTS)
    assert {"p99 TTFT", "p99 TPOT", "throughput"} <= set(table["metric"])
    errors = table["error_pct"].dropna()
    assert len(errors) > 0 and (errors.abs() < 1e-6).all()
    a = cluster_replay.agreement(table)
    assert a["points"] == 3 and a["same_verdict"] == 3 and math.isclose(a["median_abs_error_pct"]["p99 TTFT"], 0.0)
    assert table.loc[table["rate"] == 400.0, "real_met"].eq(False).all()  # 400 req/s on two replicas: missed
    # the records as scripts/compress_runs.sh leaves them (xz) give the same replay
    run = tmp_path / "r1"
    pd.read_csv(run / "requests.csv").to_csv(run / "requests.csv.xz", index=False)
    (run / "requests.csv").unlink()
    assert cluster_replay.replay_run(run, COST, SCHED).equals(table)


def test_a_run_on_another_cost_or_router_is_not_given_back(tmp_path):
    decode = {**COST.gpu.decode, "intercept_ms": 4.0}
    slower = dataclasses.replace(COST, gpu=dataclasses.replace(COST.gpu, decode=decode))
    table = cluster_replay.replay_run(_run(tmp_path, cost=slower), COST, SCHED)
    assert table.loc[table["metric"] == "p99 TPOT", "error_pct"].lt(-10).all()
    other = tmp_path / "other"
    other.mkdir()
    routed = cluster_replay.replay_run(_run(other, router_as_run="round_robin"), COST, SCHED)
    two = routed[(routed["replicas"] == 2) & (routed["metric"] == "p99 TTFT")]
    assert two["error_pct"].abs().max() > 1e-6  # the replay routes by prefix, the run did not


def test_the_page_sets_the_replay_beside_the_measured_capacity(tmp_path):
    from types import SimpleNamespace

    from servelab_book import beyond_one_gpu

    run = tmp_path / "nvidia-h200-x2" / beyond_one_gpu.MULTI_GPU / "runs" / "abc" / "n2-prefix_affinity"
    run.mkdir(parents=True)
    made = _run(run)  # r1
    meta = json.loads((made / "run.json").read_text())
    meta |= {"complete": True, "repeat_index": 1, "device": {"name": "NVIDIA H200", "gpus": 2}}
    meta["params"] |= {"model": str(COST.gpu.model)}
    (made / "run.json").write_text(json.dumps(meta, default=str))
    cap = {"router": [capacity_run.SINGLE, "prefix_affinity"], "replicas": [1, 2], "met_req_s": [20.0, 40.0],
           "missed_req_s": [40.0, 400.0], "scaling": [1.0, 1.0]}  # fmt: skip
    pd.DataFrame(cap).to_csv(made / "capacity.csv", index=False)
    page = SimpleNamespace(cap={"cost": COST, "slo": (200.0, 3.0), "sched": SCHED}, tables={
        "replica_capacity": pd.DataFrame(cap).assign(met_req_s=[22.0, 44.0])})  # fmt: skip
    text = beyond_one_gpu.status_md(tmp_path, page)
    assert "Median |error| **10 %**" in text  # 20 measured, 22 predicted at N = 1; 40 and 44 at N = 2
    assert "the replay gives the real SLO verdict at **3 of 3** points" in text and "p99 TTFT 0 %" in text
