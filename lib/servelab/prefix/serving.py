"""Server level: a prefix-repetition workload over HTTP, prefix caching off and then on.

Requests arrive as a Poisson stream; each starts with one of a few long system prompts, picked with Zipf(α)
popularity, then a user message of its own. The engine measured above is served in this process by
``servelab.server`` (``ServerThread``: uvicorn and the engine thread); the load generator runs in a process
of its own (``servelab.loadgen.worker``) so its timestamps never wait on this process's GIL. Between the two
runs, with the engine idle, ``Engine.set_prefix_caching`` switches the cache (it starts empty). The hit rate
is read from the server's ``/metrics`` (gauge ``servelab_prefix_cache_hit_rate``, fed from the engine).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.engine import Engine
from servelab.loadgen.arrivals import poisson_arrivals
from servelab.loadgen.metrics import request_metrics, summarize
from servelab.loadgen.workload import Trace
from servelab.prefix.budget import SKIPPED, Budget
from servelab.prefix.first_token import random_tokens
from servelab.prefix.workload import ZipfWorkload

HIT_RATE_GAUGE = "servelab_prefix_cache_hit_rate"
CACHING = ("off", "on")


def prefix_trace(n_requests: int, rate: float, n_prefixes: int, alpha: float, prefix_tokens: int,
                 suffix_tokens: int, output_tokens: int, vocab: int, seed: int = 0) -> tuple[Trace, np.ndarray]:
    """The workload: a ``Trace`` with prompt ids, and which prefix each request starts with (0 = most popular)."""
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rate, n_requests, rng)
    keys = ZipfWorkload(alpha, n_prefixes).keys(n_requests, rng)
    prefixes = [random_tokens(rng, prefix_tokens, vocab) for _ in range(n_prefixes)]
    prompts = [prefixes[k] + random_tokens(rng, suffix_tokens, vocab) for k in keys]
    frame = pd.DataFrame({"request_id": range(n_requests), "arrival_s": arrivals,
                          "prompt_tokens": [len(p) for p in prompts], "output_tokens": output_tokens,
                          "prompt_ids": prompts})
    source = (f"{n_requests} requests, Poisson {rate:g} req/s; prefix: one of {n_prefixes} system prompts of "
              f"{prefix_tokens} tokens, Zipf α={alpha:g}; then {suffix_tokens} tokens of its own; {output_tokens} out")
    return Trace(frame, source=source), keys


def ideal_hit_rate(keys, prefix_tokens: int, prompt_tokens: int, block_size: int) -> float:
    """Hit rate of an unbounded cache: every request but each prefix's first reuses the prefix's full blocks."""
    keys = np.asarray(keys)
    repeats = len(keys) - len(np.unique(keys))
    return repeats * (prefix_tokens // block_size * block_size) / (len(keys) * prompt_tokens)


def read_gauge(base_url: str, name: str) -> float:
    """A gauge's value from the server's Prometheus ``/metrics`` (NaN if absent)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    return float("nan")


def _wait_idle(engine: Engine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished() or engine.block_manager.num_used_blocks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine not idle after {timeout_s:.0f} s")
        time.sleep(0.02)


def _one_run(engine, worker, server, trace, workdir, deadline_s, load, mode, per_request, gauge_period_s,
             log) -> dict:
    """One replay of ``trace`` with caching ``mode``; the summary fields (``status`` "ok" or the error)."""
    try:
        _wait_idle(engine)
        engine.set_prefix_caching(mode == "on")
        records, meta = worker.run(server.base_url, trace, workdir, deadline_s, name=f"{load}_{mode}")
        _wait_idle(engine)
        time.sleep(gauge_period_s + 0.2)  # the engine loop refreshes the gauge this often
        stats = engine.stats()
        duration = meta.get("duration_s")
        ok = records[records["ok"].astype(bool)]
        row = summarize(records, duration_s=duration)
        row.update({"duration_s": duration,
                    "prompt_throughput_tok_s": ok["prompt_tokens"].sum() / duration if duration else np.nan,
                    # with caching off the engine reports no hit rate and the gauge keeps its last value
                    "hit_rate_metrics": read_gauge(server.base_url, HIT_RATE_GAUGE) if mode == "on" else np.nan,
                    "hit_rate_engine": stats.get("prefix_hit_rate", np.nan),
                    "block_hit_rate_engine": stats.get("prefix_block_hit_rate", np.nan),
                    "prompt_tokens": int(records["prompt_tokens"].sum()), "status": "ok"})
        per_request.append(request_metrics(records).drop(columns=["itl"]).assign(load=load, caching=mode))
        return row
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, not fatal
        status = f"error: {type(e).__name__}: {e}"[:300]
        log(f"{load}, caching {mode}: {status}")
        return {"status": status}


def serve_comparison(engine: Engine, traces: dict[str, Trace], workdir, *, deadline_s: float, caching=CACHING,
                     budget: Budget | None = None, run_estimate_s: float = 0.0, progress: bool = True,
                     log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay each trace (``{load name: Trace}``) through the HTTP server once per caching setting. Returns the
    per-request metrics (``request_metrics`` + ``load``, ``caching``) and one summary row per (load, caching):
    ``summarize`` keys, prompt-token throughput, hit rates from ``/metrics`` and from the engine, ``status``.
    A run is skipped when ``budget`` has less than ``run_estimate_s`` left."""
    from tqdm.auto import tqdm

    workdir = Path(workdir)
    engine.on_step = None
    per_request, summary = [], []
    bar = tqdm(total=len(traces) * len(caching), desc="server runs", disable=not progress)
    try:
        from servelab.loadgen.worker import LoadWorker
        from servelab.server.engine_loop import HIT_RATE_PERIOD_S
        from servelab.server.launch import ServerThread

        with LoadWorker() as worker, ServerThread(engine) as server:
            for load, trace in traces.items():
                for mode in caching:
                    row = {"load": load, "caching": mode, "requests": len(trace)}
                    if budget is not None and budget.spent(run_estimate_s):
                        row["status"] = SKIPPED
                    else:
                        row.update(_one_run(engine, worker, server, trace, workdir, deadline_s, load, mode,
                                            per_request, HIT_RATE_PERIOD_S, log))
                    summary.append(row)
                    bar.update(1)
    except Exception as e:  # noqa: BLE001 - the server or the load generator did not start: say so, go on
        status = f"error: {type(e).__name__}: {e}"[:300]
        log(f"server-level runs: {status}")
        done = {(r["load"], r["caching"]) for r in summary}
        summary += [{"load": load, "caching": mode, "requests": len(trace), "status": status}
                    for load, trace in traces.items() for mode in caching if (load, mode) not in done]
    bar.close()
    return (pd.concat(per_request, ignore_index=True) if per_request else pd.DataFrame()), pd.DataFrame(summary)
