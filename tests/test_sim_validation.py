"""Real-vs-simulated tables: replaying runs whose truth is known (made by the simulator with known overheads),
the fitted overheads bring the error near zero on held-out runs; plus cuts, splits, the verdict and the CLI."""

import json

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.loadgen.report import parse_report
from servelab.sim import StepCostModel, simulate
from servelab.sim.__main__ import main
from servelab.sim.cost_model import CostModel
from servelab.studies.s08_simulator.study1_runs import server_limits, sim_kwargs_for
from servelab.studies.s08_simulator.validation import cut_at, error_summary, replay_trace, split_runs, validation_table
from servelab.studies.s08_simulator.verdicts import f23_finding

GPU = CostModel(
    "m",
    "test",
    {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
    {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4},
    {},
)
LIMITS = {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "num_blocks": 4096, "block_size": 16}


def _study1_like(truth):
    reqs, steps = [], []
    for sched, budget in (("chunked_prefill", 256), ("eager_cont_batch", None)):
        for i, rate in enumerate((20.0, 40.0, 80.0)):
            rng = np.random.default_rng(i)
            n = 80
            t = pd.DataFrame(
                {
                    "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                    "prompt_tokens": rng.integers(20, 400, n),
                    "output_tokens": rng.integers(5, 60, n),
                }
            )
            kw = sim_kwargs_for(LIMITS)({"scheduler": sched, "budget": budget})
            run = simulate(t, cost=truth, step_log=True, fast_forward=False, **kw)  # one row per step, as a server logs
            tag = {"model": "m", "scheduler": sched, "budget": budget, "rate": rate}
            reqs.append(run.records.drop(columns="replica").assign(**tag))
            steps.append(run.steps.drop(columns="replica").assign(**tag))
    return pd.concat(reqs, ignore_index=True), pd.concat(steps, ignore_index=True)


def test_overheads_fitted_on_calibration_runs_fix_held_out_runs():
    truth = StepCostModel(gpu=GPU, step_overhead_ms=1.0, seq_overhead_ms=0.05, ingress_ms=4.0)
    requests, steps = _study1_like(truth)
    table, calib, fitted = validation_table(
        requests, steps, {"m": StepCostModel(gpu=GPU)}, sim_kwargs=sim_kwargs_for(LIMITS)
    )
    assert set(table.columns) >= {"scheduler", "rate", "metric", "real", "sim", "error_pct", "subset", "cost_model"}
    assert set(table["subset"]) == {"calibration", "validation"}
    assert len(table) == 6 * 2 * 6  # runs × cost models × metrics
    summary = error_summary(table)
    assert set(summary["model"]) == {"all", "m"}  # pooled, and per model (one here: the two agree)
    err = summary[summary["model"] == "all"].set_index(["cost_model", "subset", "metric"])["median_abs_error_pct"]
    per_model = summary[summary["model"] == "m"].set_index(["cost_model", "subset", "metric"])["median_abs_error_pct"]
    assert per_model.equals(err)
    assert err[("gpu+overheads", "validation", "all")] < 3.0
    assert err[("gpu_only", "validation", "all")] > 3 * err[("gpu+overheads", "validation", "all")]
    c = calib.iloc[0]
    assert c["step_overhead_ms"] == pytest.approx(1.0, abs=0.3) and c["ingress_ms"] == pytest.approx(4.0, abs=1.0)
    row = f23_finding(table, "test runs")
    assert row.verdict == "changes" and row.id == "F2.3"
    assert row.headline == pytest.approx(float(row.measured_value), abs=0.05) and row.headline < 3.0
    assert row.tested_on == "m (trained weights), simulated against test runs"


def test_split_runs():
    keys = [{"model": "m", "scheduler": "a", "budget": None, "rate": r} for r in (3.0, 1.0, 2.0)]
    keys.append({"model": "m", "scheduler": "b", "budget": 64, "rate": 1.0})
    assert split_runs(keys) == ["calibration", "calibration", "validation", "validation"]


def test_cut_at_and_replay_trace():
    rec = pd.DataFrame(
        {
            "request_id": [0, 1],
            "arrival_s": [0.0, 0.5],
            "prompt_tokens": [5, 6],
            "output_tokens": [2, 3],
            "sent_s": [0.0, np.nan],
            "first_token_s": [0.1, 0.9],
            "finish_s": [0.2, 1.5],
            "token_times_s": [[0.1, 0.2], [0.9, 1.2, 1.5]],
            "ok": [True, True],
            "error": ["", ""],
        }
    )
    cut = cut_at(rec, 1.3)
    assert cut["ok"].tolist() == [True, False] and cut["output_tokens"].tolist() == [2, 2]
    assert np.isnan(cut["finish_s"].iloc[1]) and cut_at(rec, None) is rec
    tr = replay_trace(rec, outputs=np.array([2, 7]))
    assert tr["sent_s"].tolist() == [0.0, 0.5] and tr["output_tokens"].tolist() == [2, 7]


def test_server_limits_follow_study1_sizing():
    lim = server_limits({"max_num_seqs": 64, "max_model_len": 8192, "max_num_batched_tokens": 8192, "num_blocks": None})
    assert lim["num_blocks"] == 64 * 512 and lim["block_size"] == 16
    kw = sim_kwargs_for(lim)({"scheduler": "fcfs", "budget": float("nan")})
    assert kw["max_num_batched_tokens"] == 8192 and kw["scheduler"] == "fcfs"


def test_cli(tmp_path, capsys):
    cm = tmp_path / "cm.json"
    cm.write_text(
        json.dumps({"model": "m", "mode": "x", "prefill": GPU.prefill, "decode": GPU.decode, "fit_error": {}})
    )
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(json.dumps({"arrival_s": 0.01 * i, "prompt_tokens": 30 + i, "output_tokens": 5}) for i in range(20))
    )
    out = tmp_path / "o.csv"
    assert (
        main(["--trace", str(trace), "--cost-model", str(cm), "--replicas", "2", "--out", str(out), "--no-progress"])
        == 0
    )
    df = pd.read_csv(out)
    assert len(df) == 20 and df["ok"].all() and set(df["replica"]) == {0, 1}
    assert json.loads(df["token_times_s"].iloc[0]).__len__() == 5
    summary = parse_report(capsys.readouterr().out)
    assert summary["Successful requests:"] == 20 and summary["Failed requests:"] == 0
    assert summary["Total input tokens:"] == sum(30 + i for i in range(20))
    assert summary["Total generated tokens:"] == 100
    assert main(["--cost-model", str(cm), "--out", str(out)]) == 2
    assert "either --trace" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.jsonl"), "--cost-model", str(cm), "--out", str(out)]) == 2
    # a server with captured step graphs pays its prefill steps' padding: the same trace ends later
    capsys.readouterr()
    assert (
        main(
            [
                "--trace",
                str(trace),
                "--cost-model",
                str(cm),
                "--replicas",
                "2",
                "--out",
                str(out),
                "--no-progress",
                "--step-graphs",
                "--max-num-batched-tokens",
                "512",
            ]
        )
        == 0
    )
    padded = parse_report(capsys.readouterr().out)
    assert padded["Successful requests:"] == 20
    assert padded["Median TTFT (ms):"] > summary["Median TTFT (ms):"]


def test_notebook_params_validation():
    from servelab.studies.s08_simulator.params import study_params

    assert study_params("smoke")["profile"] == "smoke"
    with pytest.raises(ParameterError, match="unknown parameters"):
        study_params("smoke", rate=3)
    with pytest.raises(ParameterError, match="fresh_models"):
        study_params("smoke", fresh_models="config:tiny-llama")
    with pytest.raises(ParameterError, match="speed_replicas"):
        study_params("smoke", speed_replicas=0)
    with pytest.raises(ParameterError, match="speed_duration_s"):
        study_params("smoke", speed_duration_s=7200)
