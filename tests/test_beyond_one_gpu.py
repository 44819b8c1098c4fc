"""The "Beyond one GPU" page: the replica-capacity prediction (a bracket per router and N) and what it says was
measured."""

import json
import math
from types import SimpleNamespace

import pandas as pd
from sim_fixtures import COST

from servelab.loadgen.lengths import UniformLengths
from servelab.loadgen.workload import Trace
from servelab.studies.s08_simulator.replica_capacity import SINGLE, bracket, replica_capacity
from servelab_book import beyond_one_gpu

LENGTHS = UniformLengths(50, 150, 10, 30)
SLO = dict(slo_ttft_ms=60.0, slo_tpot_ms=6.0)


def _trace(rate: float, n: int):
    return Trace.synthetic(rate=rate, lengths=LENGTHS, duration_s=60 * n / rate, seed=1)  # 60 requests a replica


def test_the_bracket_holds_a_rate_that_meets_the_slo_and_one_that_misses_it():
    met, missed, tried = bracket(_trace, replicas=1, router="round_robin", cost=COST, start=8.0, refine=2,
                                 max_num_batched_tokens=512, **SLO)  # fmt: skip
    t = pd.DataFrame(tried)
    assert math.isfinite(met) and met < missed <= met * 2 ** (1 / 4) * 1.0001  # refined to 2^(1/4)
    assert t.loc[t["rate"] == met, "met"].item() and not t.loc[t["rate"] == missed, "met"].item()
    # from a start that misses, the search halves down to a rate that meets
    low, high, _ = bracket(_trace, replicas=1, router="round_robin", cost=COST, start=met * 8, refine=0,
                           max_num_batched_tokens=512, **SLO)  # fmt: skip
    assert low <= met * 1.0001 and high > met


def test_more_replicas_serve_more_and_one_replica_is_searched_once():
    table, tried = replica_capacity(_trace, ["round_robin", "least_outstanding"], one=8.0, replicas=(1, 2), refine=1,
                                    cost=COST, max_num_batched_tokens=512, **SLO)  # fmt: skip
    assert list(table["router"]) == [SINGLE, "round_robin", "least_outstanding"]
    one = table.loc[table["replicas"] == 1, "met_req_s"].item()
    two = table[table["replicas"] == 2]
    assert (two["met_req_s"] > one).all() and (two["scaling"] == two["met_req_s"] / (2 * one)).all()
    assert set(tried["router"]) == {SINGLE, "round_robin", "least_outstanding"}
    text = beyond_one_gpu.capacity_md(_page(table, tried))
    assert "list-table" in text and "round\\_robin" in text and "×" in text and "400 requests per replica" in text


def _page(table, tried):
    return SimpleNamespace(
        cap={"cost": COST, "slo": (60.0, 6.0), "lengths": LENGTHS}, P={"replica_requests": 400, "replica_refine": 1},
        device="cpu (test)", tables={"replica_capacity": table, "replica_capacity_tried": tried},
    )  # fmt: skip


def _measured_run(root, model: str, slo_ttft_ms: float):
    run = root / "nvidia-h200-x4" / beyond_one_gpu.MULTI_GPU / "runs" / "abc" / "replicas" / "r0"
    run.mkdir(parents=True)
    meta = {"complete": True, "git_commit": "f" * 40, "repeat_index": 0, "device": {"name": "NVIDIA H200", "gpus": 4},
            "params": {"model": model, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": 6.0, "requests_per_replica": 200,
                       "lengths_source": "uniform"}}  # fmt: skip
    (run / "run.json").write_text(json.dumps(meta))
    pd.DataFrame(
        {"router": [SINGLE, "round_robin"], "replicas": [1, 2], "met_req_s": [10.0, 16.0],
         "missed_req_s": [12.0, 20.0], "scaling": [1.0, 0.8]}
    ).to_csv(run / "capacity.csv", index=False)  # fmt: skip
    return run


def test_the_page_says_when_nothing_ran_on_several_gpus_and_sets_a_run_beside_the_prediction(tmp_path):
    assert "Not measured on more than one GPU" in beyond_one_gpu.status_md(tmp_path)
    pred = pd.DataFrame(
        {"router": [SINGLE, "round_robin"], "replicas": [1, 2], "met_req_s": [12.0, 20.0], "missed_req_s": [14.0, 24.0],
         "scaling": [1.0, 0.83]}
    )  # fmt: skip
    page = _page(pred, pd.DataFrame({"requests": [1]}))
    _measured_run(tmp_path, str(COST.gpu.model), 60.0)
    text = beyond_one_gpu.status_md(tmp_path, page)
    assert "**Measured** on 4× NVIDIA H200 at fffffff (nvidia-h200-x4, repeat 0)" in text and "list-table" in text
    assert "N = 1 (one replica): 10.0 measured, 12.0 simulated (+20 %)" in text and "Median |error| **22 %**" in text
    other = tmp_path / "other"
    _measured_run(other, str(COST.gpu.model), 500.0)  # another SLO: no error against this prediction
    assert "no error is computed" in beyond_one_gpu.status_md(other, page)
    assert beyond_one_gpu.capacity_md("the simulator's report failed: X").startswith("No prediction")
