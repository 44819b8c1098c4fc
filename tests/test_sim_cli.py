"""The simulator's command line expresses notebook 08's simulated hour (Study 1's server limits and lengths, step
graphs, compact records), and a simulated request is named by its trace's request_id, not a process counter."""

import json

import numpy as np
import pandas as pd
import pytest

from servelab.engine.step_graphs import step_graph_sizes
from servelab.loadgen.lengths import ShareGPTLike
from servelab.loadgen.report import parse_report
from servelab.loadgen.workload import Trace
from servelab.sim.__main__ import main
from servelab.sim.cost_model import StepCostModel
from servelab.sim.simulator import simulate
from servelab.studies.s08_simulator.study1_runs import server_limits, sim_kwargs_for

COST = "data/validation/frozen/sim_cost_model_config_qwen2-0.5b.json"  # the frozen model (the README example's moved)
STUDY1 = "data/results/nvidia-h200/01_scheduling/runs/legacy/all/r0/run.json"
# the README's example (docs-snippets/sim.md) but for the simulated duration
FAST_HOUR = [
    "--rate",
    "100",
    "--replicas",
    "8",
    "--router",
    "least_outstanding",
    "--lengths",
    "sharegpt",
    "--output-scale",
    "0.25",
    "--max-prompt-tokens",
    "6000",
    "--max-output-tokens",
    "512",
    "--max-num-seqs",
    "64",
    "--num-blocks",
    "32768",
    "--step-graphs",
    "--no-token-times",
    "--no-progress",
]


def test_cli_runs_notebook_08s_fast_hour(tmp_path, capsys):
    # what notebook 08's speed section simulates: Study 1's lengths and server limits from its committed run
    with open(STUDY1) as f:
        params = json.load(f)["params"]
    lengths = ShareGPTLike(
        prompt_scale=params["prompt_scale"],
        output_scale=params["output_scale"],
        prompt_max=params["prompt_max"],
        output_max=params["output_max"],
    )
    limits = server_limits({**params, "step_graphs": True})  # Study 1 ran on CUDA: step graphs
    kw = sim_kwargs_for(limits)({"scheduler": "chunked_prefill", "budget": None})
    assert kw["num_blocks"] == 32768 and kw["max_num_seqs"] == 64
    assert kw["step_buckets"] == step_graph_sizes(8192)
    trace = Trace.synthetic(rate=100, lengths=lengths, duration_s=4, seed=0, max_requests=10_000_000)
    cost = StepCostModel.load(COST)
    want = simulate(trace, cost=cost, replicas=8, router="least_outstanding", token_times=False, **kw).summary()
    out = tmp_path / "sim.csv"
    assert main([*FAST_HOUR, "--duration", "4", "--cost-model", COST, "--out", str(out)]) == 0
    rows = parse_report(capsys.readouterr().out)
    assert rows["Successful requests:"] == want["completed"] == len(trace)
    assert rows["P99 TTFT (ms):"] == round(want["ttft_p99_ms"], 2)
    assert rows["Median TPOT (ms):"] == round(want["tpot_p50_ms"], 2)
    assert rows["Output token throughput (tok/s):"] == round(want["throughput_tok_s"], 2)
    assert np.isnan(rows["Mean ITL (ms):"])  # no per-token times kept
    rec = pd.read_csv(out)
    assert len(rec) == len(trace) and rec["prompt_tokens"].max() <= 6000 and rec["output_tokens"].max() <= 512


def _refusing_trace() -> pd.DataFrame:
    # EagerContBatch does not chunk: a prompt longer than the step budget is refused (the server's 400)
    return pd.DataFrame(
        {
            "request_id": [7001, 7002, 7003],
            "arrival_s": [0.0, 0.1, 0.2],
            "prompt_tokens": [10, 900, 20],
            "output_tokens": [5, 5, 5],
        }
    )


def test_a_refusal_names_the_traces_request_id_and_repeats_exactly():
    cost = StepCostModel.load(COST)
    kw = dict(cost=cost, scheduler="eager_cont_batch", max_num_batched_tokens=512)
    a = simulate(_refusing_trace(), **kw).records
    b = simulate(_refusing_trace(), **kw).records  # a second simulation in the same process
    assert a["ok"].tolist() == [True, False, True]
    assert a.loc[1, "error"].startswith("request 7002 ")
    assert "max_num_batched_tokens" in a.loc[1, "error"]
    pd.testing.assert_frame_equal(a, b)


def test_cli_bad_traffic_is_refused(capsys):
    assert main(["--rate", "5", "--cost-model", COST, "--no-progress"]) == 2
    assert "--duration" in capsys.readouterr().err
    assert (
        main(
            ["--rate", "5", "--duration", "1", "--lengths", "uniform", "--prompt-range", "9", "3"]
            + ["--cost-model", COST, "--no-progress"]
        )
        == 2
    )
    assert "min <= max" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--num-requests", "--num-prompts"])
def test_cli_takes_a_request_count(flag, capsys):
    assert (
        main(
            ["--rate", "20", flag, "30", "--lengths", "fixed", "--prompt-tokens", "40", "--output-tokens", "3"]
            + ["--cost-model", COST, "--no-progress"]
        )
        == 0
    )
    rows = parse_report(capsys.readouterr().out)
    assert rows["Successful requests:"] == 30 and rows["Total input tokens:"] == 1200
    assert rows["Total generated tokens:"] == 90
