"""Study 7's server runs replayed with the simulator's prefix cache, and routers over replicas with caches."""

import json

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.measure.fingerprint import fingerprint
from servelab.sim import StepCostModel, simulate
from servelab.sim.cost_model import CostModel
from servelab.studies.s08_simulator import prefix_routing, study7_runs
from servelab.studies.s08_simulator.validation import METRICS

GPU = CostModel(
    "m",
    "test",
    {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
    {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4},
    {},
)
COST = StepCostModel(gpu=GPU, step_overhead_ms=0.5, ms_per_longest_context_token=1e-3)
PARAMS = dict(
    model="config:tiny-llama",
    scheduler="chunked_prefill",
    max_num_seqs=16,
    max_num_batched_tokens=512,
    num_blocks=2048,
    block_size=16,
    eviction="lru",
    serve_requests=60,
    serve_rate=40.0,
    serve_prefixes=3,
    serve_alpha=1.0,
    serve_prefix_tokens=256,
    serve_suffix_tokens=32,
    serve_output_tokens=8,
    seed=0,
    step_graphs=True,
)


def _real_summary(cost=COST, params=PARAMS):
    """A 'real' Study 7 serving summary made by the simulator with known costs."""
    rows = []
    for load, trace in study7_runs.serving_traces(params).items():
        for mode in ("off", "on"):
            run = simulate(trace, cost=cost, prefix_caching=mode == "on", **study7_runs.sim_kwargs(params))
            rows.append(
                {
                    "load": load,
                    "caching": mode,
                    "status": "ok",
                    **run.summary(),
                    "hit_rate_engine": run.prefix_hit_rate if mode == "on" else np.nan,
                }
            )
    return pd.DataFrame(rows)


def test_traces_are_study7s_workload():
    traces = study7_runs.serving_traces(PARAMS)
    assert set(traces) == {"poisson", "burst"}
    p = traces["poisson"].frame
    assert len(p) == 60 and (p["prompt_tokens"] == 288).all() and (p["output_tokens"] == 8).all()
    assert (traces["burst"].frame["arrival_s"] == 0).all()
    assert study7_runs.vocab_of("config:tiny-llama") > 0 and study7_runs.vocab_of("org/model") == 32000
    kw = study7_runs.sim_kwargs(PARAMS)
    assert kw["step_buckets"][-1] == 512 and kw["prefix_eviction"] == "lru"
    assert study7_runs.sim_kwargs({**PARAMS, "step_graphs": False})["step_buckets"] is None


def test_replay_with_the_true_costs_reproduces_the_runs():
    summary = _real_summary()
    table, runs = study7_runs.replay_serving(
        summary, PARAMS, {"truth": COST, "slower": study7_runs.scaled_steps(COST, 1.5)}
    )
    assert set(runs) == {"truth", "slower"} and len(runs["truth"]) == 4
    assert len(table) == 4 * 2 * len(METRICS)
    truth = table[table["cost_model"] == "truth"]
    assert truth["error_pct"].abs().max() < 1e-6
    on = truth[truth["caching"] == "on"]
    assert (on["hit_rate_sim"] == on["hit_rate_real"]).all() and (on["hit_rate_sim"] > 0.5).all()
    assert table[table["cost_model"] == "slower"]["error_pct"].abs().median() > 5
    sp = study7_runs.caching_speedups(table)
    t = sp[sp["cost_model"] == "truth"]
    assert len(t) == 4 and np.allclose(t["real_speedup"], t["sim_speedup"]) and (t["real_speedup"] > 1).all()


def test_step_cost_sensitivity_grows_with_cost():
    s = study7_runs.step_cost_sensitivity(PARAMS, COST, "poisson", "off", [1.0, 2.0, 4.0])
    assert list(s["step_cost_factor"]) == [1.0, 2.0, 4.0]
    assert s["ttft_p50_ms"].is_monotonic_increasing and s["prefill_share"].between(0, 1 + 1e-9).all()
    # dearer steps: the same prompts take a larger share of the run
    assert s["prefill_share"].iloc[-1] > s["prefill_share"].iloc[0] > 0


def test_study7_replays_the_first_repeat_whose_server_runs_all_completed(tmp_path):
    assert study7_runs.study7(tmp_path) is None
    fp = fingerprint("servelab.studies.s07_prefix_cache.measure").digest
    for rep, status in ((0, "skipped: time budget"), (1, "ok"), (2, "ok")):
        d = tmp_path / "nvidia-h200" / "07_prefix_cache" / "runs" / fp[:12] / "all" / f"r{rep}"
        d.mkdir(parents=True)
        meta = {"params": {k: v for k, v in PARAMS.items() if k != "step_graphs"}, "fingerprint": fp,
                "part": "all", "repeat_index": rep, "complete": True,
                "device": {"kind": "cuda", "slug": "nvidia-h200"}, "git_commit": f"{rep}" * 40}  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta))
        summary = _real_summary()
        summary.loc[summary.index[-1], "status"] = status  # repeat 0's time budget skipped one server run
        summary.to_csv(d / "serving_summary.csv", index=False)
    runs = study7_runs.study7(tmp_path)
    assert runs.repeat == 1 and runs.commit == "1" * 7 and len(runs.summary) == 4
    assert runs.slug == "nvidia-h200" and runs.params["step_graphs"] is True and "repeat" not in runs.summary
    assert runs.prefix_length.empty and runs.requests is None


def test_prefix_affinity_keeps_hitting_when_no_replica_holds_every_prefix():
    kw = dict(requests=400, prefixes=12, prefix_tokens=256, suffix_tokens=16, output_tokens=4)
    pools = [
        prefix_routing.pool_for_fraction(
            f, prefixes=12, prefix_tokens=256, private_tokens=20, block_size=16, max_num_seqs=16
        )
        for f in (2.0, 0.3)
    ]
    assert pools[0] > pools[1] > 16 * 2
    table = prefix_routing.compare_routers(
        lambda r: prefix_routing.affinity_trace(r, **kw),
        [50.0],
        cost=COST,
        replicas=3,
        pools=pools,
        prefixes=12,
        scheduler="chunked_prefill",
        max_num_seqs=16,
        max_num_batched_tokens=512,
    )
    assert len(table) == 2 * 3 and (table["failed"] == 0).all()
    tight = table[table["pool_blocks"] == pools[1]].set_index("router")["hit_rate"]
    ample = table[table["pool_blocks"] == pools[0]].set_index("router")["hit_rate"]
    # a pool for a third of the prefixes: spread prompts thrash every cache, affine ones fit
    assert tight["prefix_affinity"] > tight["round_robin"] + 0.1
    assert ample["round_robin"] > tight["round_robin"]
    gain = prefix_routing.affinity_gain(table)
    assert len(gain) == 2 and (gain["affinity_hit_rate"] >= gain["best_other_hit_rate"]).all()


def test_router_comparison_bad_input():
    with pytest.raises(ParameterError, match="replicas"):
        prefix_routing.compare_routers(lambda r: None, [1.0], cost=COST, replicas=0, pools=[64], prefixes=2)
    with pytest.raises(ParameterError, match="at least one"):
        prefix_routing.compare_routers(lambda r: None, [], cost=COST, replicas=2, pools=[64], prefixes=2)
    with pytest.raises(ParameterError, match="pool fractions"):
        prefix_routing.pool_for_fraction(
            0, prefixes=2, prefix_tokens=64, private_tokens=8, block_size=16, max_num_seqs=4
        )


def test_prefill_check_prices_study7s_single_prompts():
    sweep = pd.DataFrame(
        {
            "mode": ["uncached", "cached"],
            "prefix_tokens": [256, 256],
            "computed_tokens": [288, 32],
            "cached_tokens": [0, 256],
        }
    )
    sweep["step_ms"] = [
        COST.with_step_buckets([64, 128, 384, 512]).step_ms(288, 288 * 144.0, 0, 0, 1),
        COST.step_ms(32, 32 * 272.0, 0, 0, 1, 32 * 256.0, 256),
    ]
    check = study7_runs.prefill_check(sweep, {**PARAMS, "step_graphs": False}, {"truth": COST})
    assert len(check) == 2 and check.loc[1, "error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert check.loc[0, "error_pct"] < -1  # without the ladder the 288-token prompt pays no padding
    assert study7_runs.prefill_check(pd.DataFrame(), PARAMS, {"truth": COST}).empty


def test_which_process_stepped_study7s_engine():
    assert study7_runs.engine_in_process({}) is True  # runs before the parameter existed
    assert study7_runs.engine_in_process({"serve_engine_process": True}) is False


def test_first_tokens_locate_a_delay_before_the_first_step():
    # 'real' requests made by the simulator, then delayed by 200 ms in the burst (as if a front end held them):
    # the replay with the true costs matches the Poisson run everywhere and misses the burst by the delay
    rows = []
    for load, trace in study7_runs.serving_traces(PARAMS).items():
        for mode in ("off", "on"):
            rec = simulate(trace, cost=COST, prefix_caching=mode == "on", **study7_runs.sim_kwargs(PARAMS)).records
            ttft = (rec["first_token_s"] - rec["sent_s"]) * 1e3 + (200.0 if load == "burst" else 0.0)
            rows.append(
                pd.DataFrame(
                    {"request_id": rec["request_id"], "ok": True, "ttft_ms": ttft, "load": load, "caching": mode}
                )
            )
    _, runs = study7_runs.replay_serving(_real_summary(), PARAMS, {"truth": COST})
    ft = study7_runs.first_tokens(pd.concat(rows, ignore_index=True), runs["truth"])
    assert len(ft) == 4 * 3 and list(ft["quantile"].unique()) == [0.0, 0.1, 0.5]
    poisson, burst = ft[ft["load"] == "poisson"], ft[ft["load"] == "burst"]
    assert np.allclose(poisson["real_ms"], poisson["sim_ms"])
    assert np.allclose(burst["real_ms"] - burst["sim_ms"], 200.0)
