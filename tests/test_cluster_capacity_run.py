"""The real replicas' capacity search (``servelab.cluster.capacity_run``): the simulator's bracket, on servers."""

import contextlib
import json
import math

import pandas as pd

from servelab.cluster import capacity_run, run_record
from servelab.loadgen.metrics import empty_records


def _fake_point(per_replica: float):
    def point(url, n, rate):
        met = rate <= per_replica * n
        s = {"ttft_p99_ms": 1.0 if met else 9e9, "tpot_p99_ms": 1.0, "failed": 0}
        return met, s, empty_records()

    return point


def test_the_sweep_brackets_each_router_and_n_and_keeps_every_point():
    served = []

    @contextlib.contextmanager
    def serve(n, router):
        served.append((n, router))
        yield f"http://x/{n}/{router}"

    cap, points, requests = capacity_run.sweep(
        _fake_point(3.0), serve, replicas=[1, 2], routers=["round_robin", "least_outstanding"], start=2.0, steps=4,
        refine=2,
    )  # fmt: skip
    assert served == [(1, "round_robin"), (2, "round_robin"), (2, "least_outstanding")]
    assert cap["router"].tolist() == [capacity_run.SINGLE, "round_robin", "least_outstanding"]
    one = cap.iloc[0]
    assert one.met_req_s <= 3.0 < one.missed_req_s and one.missed_req_s / one.met_req_s <= 2 ** (1 / 4) + 1e-9
    assert (cap["scaling"].iloc[1:] > 0.8).all() and math.isclose(cap["scaling"].iloc[0], 1.0)
    assert set(points["router"]) == set(cap["router"]) and "router" in requests.columns
    assert len(points) == len(points.drop_duplicates(["router", "replicas", "rate"]))  # no point measured twice
    # a server that misses at every rate tried: no capacity, never a zero
    cap, _, _ = capacity_run.sweep(
        _fake_point(0.0), serve, replicas=[1], routers=["round_robin"], start=1.0, steps=2, refine=1
    )
    assert math.isnan(cap["met_req_s"].iat[0]) and cap["missed_req_s"].iat[0] == 0.25


def test_two_replicas_on_cpus_are_measured_into_the_books_layout(tmp_path):
    out = tmp_path / "cpu" / run_record.STUDY / "runs" / "abcabcabcabc" / capacity_run.PART / "r0"
    rc = capacity_run.main([
        "config:tiny-llama", "--replicas", "2", "--routers", "round_robin", "--slo-ttft-ms", "1e6",
        "--slo-tpot-ms", "1e6", "--start", "2", "--requests-per-replica", "3", "--steps", "0", "--refine", "0",
        "--lengths", "fixed", "--prompt-tokens", "8", "--output-tokens", "3", "--vocab-size", "100",
        "--prefix-groups", "2", "--prefix-tokens", "4",
        "--out", str(out), "--", "--device", "cpu", "--max-num-seqs", "4", "--log-level", "warning",
    ])  # fmt: skip
    assert rc == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["complete"] and meta["params"]["serve_args"][:2] == ["--device", "cpu"]
    points = pd.read_csv(out / "points.csv")
    assert points[["replicas", "rate", "met", "completed"]].values.tolist() == [[2, 4.0, True, 6]]
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 6 and (requests["output_tokens"] == 3).all() and set(requests["router"]) == {"round_robin"}
    from servelab_book.beyond_one_gpu import multi_gpu_runs

    assert multi_gpu_runs(tmp_path) == [out]
    # the page replays a real run's points on their own traces: the records a real server gave are what it reads
    from sim_fixtures import COST

    from servelab.studies.s08_simulator import cluster_replay

    sched = {"scheduler": "chunked_prefill", "max_num_seqs": 4, "max_num_batched_tokens": 8192, "block_size": 16}
    table = cluster_replay.replay_run(out, COST, sched)
    assert set(zip(table["router"], table["replicas"], table["rate"], strict=True)) == {("round_robin", 2, 4.0)}
    assert table.loc[table["metric"] == "p99 TTFT", ["real", "sim"]].gt(0).all(axis=None)
