"""Study 7's server runs replayed with the simulator's prefix cache: a check of the cache model on runs that
nothing was fitted to.

Study 7 served a prefix-repetition workload over HTTP (``servelab.studies.s07_prefix_cache.serving``: a Poisson
stream and a burst, each request one of a few long system prompts with Zipf popularity plus its own suffix) with prefix
caching off and then on. The traces are regenerated from its ``run.json`` parameters (same generator, same
seed), and each run is simulated on a replica with that server's limits and step-graph ladder, caching as it
was, with a cost model calibrated on Study 1's runs only (``validation.validation_table``). The comparison is
the load generator's metrics (``validation.METRICS``) and the prefix-cache hit rate, real against simulated.

The Study 7 server differs from Study 1's in ways no term here was fitted to: a 16,384-token step budget, a
prefix cache, and, in runs before its ``serve_engine_process`` parameter existed, an engine stepped by a thread of
the notebook's process beside the HTTP server (``engine_in_process`` says which).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.engine.step_graphs import step_graph_sizes
from servelab.models.loader import CONFIG_DIR
from servelab.sim.cost_model import StepCostModel
from servelab.sim.simulator import simulate
from servelab.studies.s07_prefix_cache.serving import prefix_trace
from servelab.studies.s08_simulator.validation import compare

STUDY7 = "07_prefix_cache"
FALLBACK_VOCAB = 32000


@dataclass
class Study7Runs:
    summary: pd.DataFrame  # serving_summary.csv: one row per (load, caching)
    prefix_length: pd.DataFrame  # prefix_length.csv: single prompts timed uncached and cached (may be empty)
    params: dict  # run.json's parameters (+ ``step_graphs``)
    slug: str  # the device's
    commit: str = ""  # the commit that ran
    requests: pd.DataFrame | None = None  # serving_requests.csv: one row per request of each server run
    repeat: int = 0  # the repeat of Study 7 replayed


def study7(root: Path | None = None) -> Study7Runs | None:
    """Study 7's first repeat whose server runs all completed (a repeat whose time budget skipped a server run is
    passed over: the replay compares every load and caching setting), or None."""
    from servelab.studies.common.runs import study_runs

    runs = study_runs(STUDY7, root)
    for index in runs.repeats:
        rep = runs.repeat(index)
        summary = rep.table("serving_summary")
        if summary.empty or "status" not in summary or not (summary["status"] == "ok").all():
            continue
        drop = ["part", "repeat"]
        requests = rep.table("serving_requests")
        params = dict(rep.params)
        # the server replays captured step graphs on CUDA unless told otherwise (``serve --step-graphs``, default on)
        params.setdefault("step_graphs", rep.device.get("kind") == "cuda")
        return Study7Runs(
            summary.drop(columns=[c for c in drop if c in summary.columns]),
            rep.table("prefix_length").drop(columns=drop, errors="ignore"),
            params,
            str(rep.device.get("slug") or (rep.runs[0].dir.parents[4].name if rep.runs else "")),
            str(rep.meta.get("git_commit", ""))[:7],
            requests.drop(columns=[c for c in drop if c in requests.columns]) if not requests.empty else None,
            repeat=index,
        )
    return None


def prefill_check(sweep: pd.DataFrame, params: dict, costs: dict[str, StepCostModel]) -> pd.DataFrame:
    """Study 7's single prompts (``prefix_length.csv``: ``computed_tokens`` after ``cached_tokens``, the engine
    step's median wall time ``step_ms``) against each cost model's step time on that server's step-graph ladder:
    one row per prompt × cost model with ``error_pct``. Nothing was fitted to these timings."""
    need = {"mode", "prefix_tokens", "computed_tokens", "cached_tokens", "step_ms"}
    if sweep.empty or not need <= set(sweep.columns):
        return pd.DataFrame()
    buckets = sim_kwargs(params)["step_buckets"]
    rows = []
    for name, cost in costs.items():
        c = cost.with_step_buckets(buckets) if buckets else cost
        for _, r in sweep.iterrows():
            n, k = int(r["computed_tokens"]), int(r["cached_tokens"])
            pred = c.step_ms(n, n * (k + n / 2), 0, 0, 1, n * k, k)
            rows.append(
                {
                    "cost_model": name,
                    "mode": r["mode"],
                    "prefix_tokens": int(r["prefix_tokens"]),
                    "computed_tokens": n,
                    "cached_tokens": k,
                    "real_ms": float(r["step_ms"]),
                    "sim_ms": pred,
                    "error_pct": 100 * (pred - r["step_ms"]) / r["step_ms"],
                }
            )
    return pd.DataFrame(rows)


def engine_in_process(params: dict) -> bool:
    """Whether Study 7's server stepped its engine in the notebook's process (runs that predate the parameter did)."""
    return not params.get("serve_engine_process", False)


def vocab_of(model: str) -> int:
    """The vocabulary of a ``config:<name>`` model (the trace's random ids are drawn below it; only which
    prompts share a prefix matters to a cache, so another spec falls back to 32,000)."""
    if model.startswith("config:"):
        path = CONFIG_DIR / model.split(":", 1)[1] / "config.json"
        if path.exists():
            return int(json.loads(path.read_text()).get("vocab_size", FALLBACK_VOCAB))
    return FALLBACK_VOCAB


def serving_traces(params: dict) -> dict:
    """Study 7's two server workloads, ``{"poisson": Trace, "burst": Trace}``, as its notebook built them."""
    workload = dict(
        n_prefixes=params["serve_prefixes"],
        alpha=params["serve_alpha"],
        prefix_tokens=params["serve_prefix_tokens"],
        suffix_tokens=params["serve_suffix_tokens"],
        output_tokens=params["serve_output_tokens"],
        vocab=vocab_of(params["model"]),
        seed=params["seed"],
    )
    return {
        "poisson": prefix_trace(params["serve_requests"], params["serve_rate"], **workload)[0],
        "burst": prefix_trace(params["serve_requests"], float("inf"), **workload)[0],
    }


def sim_kwargs(params: dict) -> dict:
    """``simulate``'s keywords for Study 7's server."""
    budget = int(params["max_num_batched_tokens"])
    return {
        "scheduler": params["scheduler"],
        "max_num_seqs": int(params["max_num_seqs"]),
        "max_num_batched_tokens": budget,
        "num_blocks": int(params["num_blocks"]),
        "block_size": int(params["block_size"]),
        "prefix_eviction": params.get("eviction", "lru"),
        "step_buckets": step_graph_sizes(budget) if params.get("step_graphs") else None,
    }


def replay_serving(summary: pd.DataFrame, params: dict, costs: dict[str, StepCostModel]) -> tuple[pd.DataFrame, dict]:
    """Every (load, caching) run of ``summary`` simulated with each of ``costs`` (name → cost model):
    ``(table, runs)``, the table one row per run × cost model × metric, ``load, caching, cost_model, metric,
    real, sim, error_pct``, plus the hit rates (engine's and simulated); ``runs[name][(load, caching)]`` the
    simulated ``SimRun`` (for ``first_tokens``)."""
    traces = serving_traces(params)
    kw = sim_kwargs(params)
    rows, runs = [], {name: {} for name in costs}
    for _, r in summary.iterrows():
        trace = traces.get(r["load"])
        if trace is None:
            continue
        for name, cost in costs.items():
            run = simulate(trace, cost=cost, prefix_caching=r["caching"] == "on", **kw)
            runs[name][(r["load"], r["caching"])] = run
            for row in compare(r.to_dict(), run.summary()):
                rows.append(
                    {
                        "load": r["load"],
                        "caching": r["caching"],
                        "cost_model": name,
                        **row,
                        "hit_rate_real": r.get("hit_rate_engine", np.nan),
                        "hit_rate_sim": run.prefix_hit_rate,
                    }
                )
    return pd.DataFrame(rows), runs


def first_tokens(requests: pd.DataFrame, runs: dict, quantiles=(0.0, 0.1, 0.5)) -> pd.DataFrame:
    """Where in a run the TTFT error sits: per (load, caching) run of ``requests`` (``serving_requests.csv``)
    that ``runs`` (``(load, caching)`` → its simulated ``SimRun``, from ``replay_serving``) holds, the real and
    simulated TTFT at ``quantiles`` (0: the earliest first token). A burst whose earliest request waits as long
    as its median one points to a delay before the engine's first step, which no step cost explains."""
    rows = []
    for (load, caching), r in requests.groupby(["load", "caching"], sort=False):
        if (load, caching) not in runs:
            continue
        rec = runs[(load, caching)].records
        sim = (rec["first_token_s"] - rec["sent_s"]) * 1e3
        real = r.loc[r["ok"].astype(bool), "ttft_ms"] if "ok" in r else r["ttft_ms"]
        for q in quantiles:
            rows.append(
                {
                    "load": load,
                    "caching": caching,
                    "quantile": float(q),
                    "real_ms": float(real.quantile(q)),
                    "sim_ms": float(sim.quantile(q)),
                }
            )
    return pd.DataFrame(rows)


def caching_speedups(table: pd.DataFrame) -> pd.DataFrame:
    """Per load and cost model: what caching does to p50 and p99 TTFT (off / on), real and simulated."""
    out = []
    for (load, cm, metric), g in table[table["metric"].isin(["p50 TTFT", "p99 TTFT"])].groupby(
        ["load", "cost_model", "metric"], sort=False
    ):
        by = g.set_index("caching")
        if not {"off", "on"} <= set(by.index):
            continue
        real = by.loc["off", "real"] / by.loc["on", "real"]
        sim = by.loc["off", "sim"] / by.loc["on", "sim"]
        out.append(
            {
                "load": load,
                "cost_model": cm,
                "metric": metric,
                "real_speedup": real,
                "sim_speedup": sim,
                "error_pct": 100 * (sim - real) / real,
            }
        )
    return pd.DataFrame(out)


def scaled_steps(cost: StepCostModel, factor: float) -> StepCostModel:
    """``cost`` with every step lasting ``factor`` times as long (the ingress delay unchanged)."""
    return cost.with_overheads(
        prefill_scale=cost.prefill_scale * factor,
        decode_scale=cost.decode_scale * factor,
        step_overhead_ms=cost.step_overhead_ms * factor,
        seq_overhead_ms=cost.seq_overhead_ms * factor,
        mixed_step_ms=cost.mixed_step_ms * factor,
        ms_per_context_pair=cost.ms_per_context_pair * factor,
        source=f"{cost.source}, steps ×{factor:g}",
    )


def step_cost_sensitivity(params: dict, cost: StepCostModel, load: str, caching: str, factors) -> pd.DataFrame:
    """How one Study 7 run's simulated TTFT moves when every step costs ``factor`` times the model's: one row per
    factor with p50/p99 TTFT and p50 ITL, and the share of the run the simulated server spent in steps with
    prefill (``prefill_share``; near 1, prompts queue behind each other and small cost errors decide the wait)."""
    trace = serving_traces(params)[load]
    kw = sim_kwargs(params)
    rows = []
    for f in factors:
        run = simulate(trace, cost=scaled_steps(cost, float(f)), prefix_caching=caching == "on", step_log=True, **kw)
        s, st = run.summary(), run.steps
        span = float(st["end_s"].max() - st["start_s"].min()) if len(st) else np.nan
        pre = st["prefill_tokens"] > 0
        share = float((st["end_s"] - st["start_s"])[pre].sum()) / span if span else np.nan
        rows.append(
            {
                "load": load,
                "caching": caching,
                "step_cost_factor": float(f),
                "ttft_p50_ms": s["ttft_p50_ms"],
                "ttft_p99_ms": s["ttft_p99_ms"],
                "itl_p50_ms": s["itl_p50_ms"],
                "prefill_share": share,
            }
        )
    return pd.DataFrame(rows)
