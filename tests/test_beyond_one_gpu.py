"""The "Beyond one GPU" page: the replica-capacity prediction (a bracket per router and N) and what it says was
measured."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
from sim_fixtures import COST

from servelab.errors import ParameterError
from servelab.loadgen.lengths import UniformLengths
from servelab.loadgen.workload import Trace
from servelab.studies.s08_simulator.replica_capacity import SINGLE, bracket, replica_capacity
from servelab_book import beyond_one_gpu

LENGTHS = UniformLengths(50, 150, 10, 30)
SLO = dict(slo_ttft_ms=60.0, slo_tpot_ms=6.0)
SCHED = {"scheduler": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 512, "block_size": 16}


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
    # the simulator page's "one replica sustains about …" is another search on other traces: the page says which
    at = tried[(tried["replicas"] == 1) & (tried["rate"] == 8.0)].iloc[0]
    assert "The simulator page's one replica sustains about 8.0 req/s at the same SLO" in text
    assert f"On this table's trace of {at.requests:,.0f} requests that rate {'meets' if at.met else 'misses'}" in text


def _page(table, tried):
    return SimpleNamespace(
        cap={"cost": COST, "slo": (60.0, 6.0), "lengths": LENGTHS, "one": 8.0, "sched": SCHED},
        P={"replica_requests": 400, "replica_refine": 1, "prefix_groups": 16, "prefix_tokens": 256,
           "rate_search_refine": 1, "capacity_max_requests": 240},
        s1_params={"max_model_len": 8192}, device="cpu (test)",
        tables={"replica_capacity": table, "replica_capacity_tried": tried},
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
    said = beyond_one_gpu.status_md(tmp_path)
    assert "Not measured on more than one GPU" in said and "every measurement in this book was made on one GPU" in said
    assert "lent" not in said  # the sessions that measured are no part of what the reader can use
    pred = pd.DataFrame(
        {"router": [SINGLE, "round_robin"], "replicas": [1, 2], "met_req_s": [12.0, 20.0], "missed_req_s": [14.0, 24.0],
         "scaling": [1.0, 0.83]}
    )  # fmt: skip
    page = _page(pred, pd.DataFrame({"requests": [1]}))
    _measured_run(tmp_path, str(COST.gpu.model), 60.0)
    text = beyond_one_gpu.status_md(tmp_path, page)
    assert "**Measured** on 4× NVIDIA H200 at fffffff (nvidia-h200-x4, repeat 0, 1 part)" in text
    assert "list-table" in text
    assert "N = 1 (one replica): 10.0 measured, 12.0 simulated (+20 %)" in text and "Median |error| **22 %**" in text
    other = tmp_path / "other"
    _measured_run(other, str(COST.gpu.model), 500.0)  # another SLO: no error against this prediction
    assert "no error is computed" in beyond_one_gpu.status_md(other, page)
    assert beyond_one_gpu.capacity_md("the simulator's report failed: X").startswith("No prediction")


def _tp_run(root, repeat: int, step_ms: dict, first_ms: float = 20.0, new_tokens: int = 5, part: str = "tp"):
    """A tensor parallel run whose decode step takes ``step_ms[tp]`` in every sample (two samples a call)."""
    run = root / "nvidia-h200-x4" / beyond_one_gpu.MULTI_GPU / "runs" / "fedcba" / part / f"r{repeat}"
    run.mkdir(parents=True)
    params = {"model": "config:llama-3-8b", "dtype": "bfloat16", "samples": 2, "new_tokens": new_tokens}
    meta = {"complete": True, "git_commit": f"{repeat}" * 40, "repeat_index": repeat, "part": "tp",
            "device": {"name": "NVIDIA H200", "gpus": 4}, "params": params}  # fmt: skip
    (run / "run.json").write_text(json.dumps(meta))
    rows = [
        dict(tp=tp, batch=1, prompt_tokens=128, new_tokens=new_tokens, call=call, sample=k, clock="cuda_event",
             ms=first_ms / tp + (step * (new_tokens - 1) if call == "whole" else 0.0))
        for tp, step in step_ms.items() for k in range(2) for call in ("first", "whole")
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(run / "samples.csv", index=False)
    # greedy tokens: TP = 2 keeps TP = 1's in the first sequence and differs from token 3 on in the second
    ids = {(1, 0): [1, 2, 3, 4], (1, 1): [5, 6, 7, 8], (2, 0): [1, 2, 3, 4], (2, 1): [5, 6, 7, 9]}
    pd.DataFrame(
        [dict(tp=tp, batch=1, prompt_tokens=128, sequence=i, tokens=json.dumps(t)) for (tp, i), t in ids.items()
         if tp in step_ms]
    ).to_csv(run / "tokens.csv", index=False)  # fmt: skip


def test_tensor_parallel_runs_read_as_one_table_of_medians_over_their_repeats(tmp_path):
    for repeat, two in enumerate((5.0, 4.0, 6.0)):  # TP = 2's decode step in each repeat; TP = 1's is 8 ms
        _tp_run(tmp_path, repeat, {1: 8.0, 2: two})
    text = beyond_one_gpu.status_md(tmp_path)
    assert "Not measured" not in text and "tensor parallel, on 4× NVIDIA H200" in text and "3 repeats" in text
    assert "CUDA events" in text and "no conclusion" not in text
    t = beyond_one_gpu.tp_summary(beyond_one_gpu.multi_gpu_runs(tmp_path))
    two = t[t["tp"] == 2].iloc[0]
    assert math.isclose(two.step_ms_median, 5.0) and (two.step_ms_min, two.step_ms_max) == (4.0, 6.0)
    assert math.isclose(two.speedup_median, 8.0 / 5.0) and math.isclose(two.speedup_max, 2.0)
    assert math.isclose(two.first_ms_median, 10.0) and two.repeats == 3
    assert "5.000 (4.000–6.000)" in text and "×1.60 (1.33–2.00)" in text
    assert "TP = 2: 3 of 6 sequences identical, the others first differ at token 3 (median)" in text


def test_fewer_than_three_tensor_parallel_repeats_are_shown_and_not_concluded_on(tmp_path):
    _tp_run(tmp_path, 0, {1: 8.0, 2: 5.0})
    text = beyond_one_gpu.status_md(tmp_path)
    assert "1 repeat in fresh" in text and "no conclusion is drawn" in text and "×1.60" in text


def _part_run(root, folder: str, part: str, gpus: int, rows: dict):
    run = root / folder / beyond_one_gpu.MULTI_GPU / "runs" / "abc" / part / "r0"
    run.mkdir(parents=True)
    meta = {"complete": True, "git_commit": "e" * 40, "repeat_index": 0,
            "device": {"name": "NVIDIA H200", "gpus": gpus},
            "params": {"model": "m", "slo_ttft_ms": 60.0, "slo_tpot_ms": 6.0, "requests_per_replica": 400}}  # fmt: skip
    (run / "run.json").write_text(json.dumps(meta))
    pd.DataFrame(rows).to_csv(run / "capacity.csv", index=False)


def test_a_repeats_parts_from_machines_of_one_and_two_gpus_read_as_one_table_scaled_by_one_replica(tmp_path):
    _part_run(tmp_path, "nvidia-h200", "n1", 1, {"router": [SINGLE], "replicas": [1], "met_req_s": [10.0],
                                                  "missed_req_s": [12.0], "scaling": [1.0]})  # fmt: skip
    alone = beyond_one_gpu.status_md(tmp_path)
    assert "Not measured on more than one GPU" in alone and "beside what one GPU measured" in alone
    assert "≥" not in alone and "10–12 req/s" in alone  # one replica alone: its own column
    _part_run(tmp_path, "nvidia-h200-x2", "n2-round_robin", 2, {"router": ["round_robin"], "replicas": [2],
              "met_req_s": [15.0], "missed_req_s": [18.0], "scaling": [float("nan")]})  # fmt: skip
    text = beyond_one_gpu.status_md(tmp_path)
    assert "Not measured" not in text and "1× NVIDIA H200, 2× NVIDIA H200" in text and "2 parts" in text
    assert "15–18 req/s (×0.75)" in text  # scaled by the one-replica part of the same repeat


def test_the_real_run_is_given_the_predictions_own_settings():
    from servelab.cluster import capacity_run
    from servelab.loadgen.lengths import ShareGPTLike, lengths_from_args
    from servelab.server.flags import parse_args
    from servelab.studies.s08_simulator import cluster_run

    for lengths in (LENGTHS, ShareGPTLike(prompt_max=6000, output_max=512, output_scale=0.25)):
        page = _page(pd.DataFrame(), pd.DataFrame())
        page.cap["lengths"] = lengths
        argv = cluster_run.replicas_argv(page, "n4-least_outstanding", 2)
        split = argv.index("--")
        a = capacity_run.build_parser().parse_args(argv[:split])
        assert (a.model, a.replicas, a.routers, a.part, a.repeat) == (
            str(COST.gpu.model), [4], ["least_outstanding"], "n4-least_outstanding", 2)  # fmt: skip
        assert (a.slo_ttft_ms, a.slo_tpot_ms, a.start, a.requests_per_replica, a.refine) == (60.0, 6.0, 8.0, 400, 1)
        assert (a.prefix_groups, a.prefix_tokens) == (16, 256)
        assert lengths_from_args(a) == lengths
        served = parse_args(argv[split + 1 :])
        assert (served.scheduler, served.max_num_seqs, served.max_num_batched_tokens) == ("chunked_prefill", 64, 512)
        assert served.prefix_caching is False and served.max_model_len == 8192
    with pytest.raises(ParameterError, match="no part"):
        cluster_run.replicas_argv(page, "n3-round_robin", 0)
    page.cap = {}
    with pytest.raises(ParameterError, match="no replica prediction"):
        cluster_run.replicas_argv(page, "n1", 0)


def test_a_repeat_in_parts_of_one_size_each_reads_as_one_run_of_every_size(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for repeat, two in enumerate((5.0, 4.0, 6.0)):
        _tp_run(whole, repeat, {1: 8.0, 2: two})
        _tp_run(parts, repeat, {1: 8.0}, part="tp1")
        _tp_run(parts, repeat, {2: two}, part="tp2")
    one = beyond_one_gpu.tp_summary(beyond_one_gpu.multi_gpu_runs(whole))
    split = beyond_one_gpu.tp_summary(beyond_one_gpu.multi_gpu_runs(parts))
    assert split.equals(one) and (split["repeats"] == 3).all()
    text = beyond_one_gpu.status_md(parts)
    assert "3 repeats in fresh" in text and "×1.60 (1.33–2.00)" in text and "3 of 6 sequences identical" in text
