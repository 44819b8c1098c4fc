"""Study 7's measuring path: the machine's record and ceilings; on one engine, TTFT against the shared prefix length
(F7.1), a multi-turn conversation (F7.2) and n requests sharing a prefix (F7.3); the cache-policy simulator (F7.4,
its hit rates are this study's measurement of the policies); and a prefix-repetition workload served over HTTP,
caching off and on. It writes raw tables only (``prefix_length``, ``multi_turn``, ``batch_sharing``,
``policy_hit_rates``, ``serving_requests``, ``serving_summary``) and ``engine.json`` (the engine's settings, the
server trace's description, the wall time); speedups, breakevens, cost fits and verdicts are the reporting path's.
"""

from __future__ import annotations

import functools
import gc
import tempfile
from pathlib import Path

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.budget import Budget
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s07_prefix_cache.batch_sharing import batch_sharing_sweep
from servelab.studies.s07_prefix_cache.multi_turn import build_conversation, multi_turn_sweep
from servelab.studies.s07_prefix_cache.prefix_length import prefix_length_sweep
from servelab.studies.s07_prefix_cache.serving import ideal_hit_rate, prefix_trace, serve_comparison
from servelab.studies.s07_prefix_cache.simulate import hit_rates
from servelab.studies.s07_prefix_cache.study import build_engine

STUDY = "07_prefix_cache"
PARTS = {"all": 3.0}  # one part; minutes on the H200 (the legacy run took 87 s) before a run records its own


def _serving_reserve_s(P: dict) -> float:
    """What the server-level runs need of the budget: the server's start and warm-up, then both loads (Poisson,
    burst) with caching off and on."""
    return P["serve_build_estimate_s"] + 2 * 2 * P["serve_run_estimate_s"] if P["serve"] == "http" else 0.0


def _engine_parts(P: dict, engine, roof, budget: Budget) -> dict:
    """F7.1–F7.3 on the engine, timed: the raw sweeps by table name. They stop where only the server runs'
    reserve is left of ``budget``."""
    sweeps = Budget(budget.sweep_budget_s(_serving_reserve_s(P)))
    kw = dict(warmup=P["warmup"], repeats=P["repeats"], budget=sweeps, progress=False)
    t = {
        "prefix_length": prefix_length_sweep(
            engine, P["prefix_lengths"], P["suffix_tokens"], roof, seed=P["seed"], **kw
        )
    }
    conversation = build_conversation(
        engine, P["turns"], P["system_tokens"], P["user_tokens"], P["reply_tokens"], seed=P["seed"]
    )
    t["multi_turn"] = multi_turn_sweep(engine, conversation, P["reply_tokens"], turn_repeats=P["turn_repeats"], **kw)
    t["batch_sharing"] = batch_sharing_sweep(
        engine, P["share_prefixes"], P["share_batches"], P["suffix_tokens"], roof, seed=P["seed"], **kw
    )
    return t


def _serving(P: dict, engine, kind: str, budget: Budget) -> tuple[dict, str]:
    """The server-level runs (caching off, then on; Poisson and burst): their tables and the trace's description."""
    workload = dict(
        n_prefixes=P["serve_prefixes"],
        alpha=P["serve_alpha"],
        prefix_tokens=P["serve_prefix_tokens"],
        suffix_tokens=P["serve_suffix_tokens"],
        output_tokens=P["serve_output_tokens"],
        vocab=engine.model.shape.vocab,
        seed=P["seed"],
    )
    poisson, keys = prefix_trace(P["serve_requests"], P["serve_rate"], **workload)
    burst, _ = prefix_trace(P["serve_requests"], float("inf"), **workload)
    prompt = P["serve_prefix_tokens"] + P["serve_suffix_tokens"]
    # the engine in a process of its own (built there from the same parameters), or this process's engine
    build = functools.partial(build_engine, P, kind) if P["serve_engine_process"] else None
    req, summary = serve_comparison(
        engine,
        {"poisson": poisson, "burst": burst},
        tempfile.mkdtemp(),
        build=build,
        deadline_s=P["serve_deadline_s"],
        budget=budget,
        run_estimate_s=P["serve_run_estimate_s"],
        build_estimate_s=P["serve_build_estimate_s"],
        progress=False,
    )
    summary["ideal_hit_rate"] = ideal_hit_rate(keys, P["serve_prefix_tokens"], prompt, P["block_size"])
    return {"serving_requests": req, "serving_summary": summary}, poisson.source


def measure(P: dict) -> Path:
    """Measure the machine, the engine's sweeps, the policy simulator and the server runs; the run's folder."""
    with quiet_run():
        dev = device_record()
        ceil = measure_ceilings()
        roof = Roofline.from_ceilings(ceil)
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        budget = Budget(P["time_budget_s"])
        engine = build_engine(P, dev.kind)
        stats = engine.stats()
        tables = _engine_parts(P, engine, roof, budget)
        tables["policy_hit_rates"] = hit_rates(
            P["sim_alphas"],
            P["sim_capacities"],
            P["sim_policies"],
            n_prefixes=P["sim_prefixes"],
            n_requests=P["sim_requests"],
            seed=P["seed"],
            progress=False,
        )
        source = ""
        if P["serve"] == "http":
            served, source = _serving(P, engine, dev.kind, budget)
            tables.update(served)
        for name, df in tables.items():
            res.write(name, df)
        res.write_json("engine", {"stats": stats, "serve_source": source, "elapsed_s": budget.elapsed_s()})
        del engine
        gc.collect()
        if dev.kind == "cuda":
            import torch

            torch.cuda.empty_cache()
        res.finish()
        return res.dir
