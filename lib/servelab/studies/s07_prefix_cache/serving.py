"""Server level: a prefix-repetition workload over HTTP, prefix caching off and then on.

Requests arrive as a Poisson stream; each starts with one of a few long system prompts, picked with Zipf(α)
popularity, then a user message of its own. The engine is served by ``servelab.server`` (``ServerThread``:
uvicorn in this process); by default the engine runs in a process of its own (``EngineProcess``, built by a
picklable ``build``), as Study 1's does, so that HTTP work for hundreds of concurrent streams never holds the
engine up on this interpreter's GIL; given an ``Engine`` instead, one thread of this process steps it. The load
generator runs in a process of its own (``servelab.loadgen.worker``) so its timestamps never wait on this
process's GIL. Between the two runs, with the engine idle, ``Engine.set_prefix_caching`` switches the cache
(it starts empty), through a call into the engine's thread. The hit rate is read from the server's
``/metrics`` (gauge ``servelab_prefix_cache_hit_rate``, fed from the engine).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.engine import Engine
from servelab.loadgen.arrivals import poisson_arrivals
from servelab.loadgen.metrics import request_metrics, summarize
from servelab.loadgen.workload import Trace
from servelab.server.heap import freeze_heap
from servelab.studies.common.budget import SKIPPED, Budget
from servelab.studies.s07_prefix_cache.first_token import random_tokens
from servelab.studies.s07_prefix_cache.workload import ZipfWorkload

HIT_RATE_GAUGE = "servelab_prefix_cache_hit_rate"
CACHING = ("off", "on")


def prefix_trace(
    n_requests: int,
    rate: float,
    n_prefixes: int,
    alpha: float,
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    vocab: int,
    seed: int = 0,
) -> tuple[Trace, np.ndarray]:
    """The workload: a ``Trace`` with prompt ids, and which prefix each request starts with (0 = most popular).

    The arrival times come from a stream of their own (``[seed, 1]``), so that one seed gives the same prefixes and
    prompts at every rate: the Poisson load and the burst serve the same requests, and one ideal hit rate holds for
    both (a burst draws no arrival times, which used to shift every prompt after it)."""
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rate, n_requests, np.random.default_rng([seed, 1]))
    keys = ZipfWorkload(alpha, n_prefixes).keys(n_requests, rng)
    prefixes = [random_tokens(rng, prefix_tokens, vocab) for _ in range(n_prefixes)]
    prompts = [prefixes[k] + random_tokens(rng, suffix_tokens, vocab) for k in keys]
    frame = pd.DataFrame(
        {
            "request_id": range(n_requests),
            "arrival_s": arrivals,
            "prompt_tokens": [len(p) for p in prompts],
            "output_tokens": output_tokens,
            "prompt_ids": prompts,
        }
    )
    source = (
        f"{n_requests} requests, Poisson {rate:g} req/s; prefix: one of {n_prefixes} system prompts of "
        f"{prefix_tokens} tokens, Zipf α={alpha:g}; then {suffix_tokens} tokens of its own; {output_tokens} out"
    )
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


# ---- run in the engine's thread (this process or the engine process), between two steps ----------------
def engine_state(loop) -> dict:
    """Whether the engine has requests left and how many KV blocks are in use."""
    return {"unfinished": loop.engine.has_unfinished(), "used_blocks": loop.engine.kv_blocks()[0]}


def set_caching(loop, enabled: bool) -> None:
    loop.engine.set_prefix_caching(enabled)


def engine_stats(loop) -> dict:
    return loop.engine.stats()


class ServedEngine:
    """The engine behind the HTTP server, in this process (``engine``) or in one of its own (``build``, a
    picklable function that builds it there); ``call(fn, *args)`` runs ``fn(engine_loop, *args)`` in the
    engine's thread between two steps either way."""

    def __init__(self, engine: Engine | None = None, build=None):
        if (engine is None) == (build is None):
            raise ValueError("give either an engine (served in this process) or build (an engine process)")
        self.engine, self.build = engine, build
        self.thread = self._ep = None

    def __enter__(self) -> ServedEngine:
        from servelab.server.launch import ServerThread

        if self.build is not None:
            from servelab.server.engine_process import EngineProcess

            self._ep = EngineProcess(self.build)
            self._ep.launch()
            self.thread = ServerThread(self._ep).start()
        else:
            self.engine.on_step = None
            self.thread = ServerThread(self.engine).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is not None:
            self.thread.stop()  # drains the engine loop; an engine process exits
            self.thread = None
        proc = getattr(self._ep, "proc", None)
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(10.0)

    @property
    def base_url(self) -> str:
        return self.thread.base_url

    def call(self, fn, *args, timeout_s: float = 120.0):
        if self._ep is not None:
            return self._ep.call(fn, *args, timeout_s=timeout_s)
        return self.thread.state.loop.call(lambda lp: fn(lp, *args)).result(timeout_s)

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until no request is left and every KV block is free; ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.call(engine_state)
            if not (state["unfinished"] or state["used_blocks"] or self.thread.state.loop.num_waiting):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine not idle after {timeout_s:.0f} s: {state}")
            time.sleep(0.02)


def _one_run(
    served: ServedEngine, worker, trace, workdir, deadline_s, load, mode, per_request, gauge_period_s, log
) -> dict:
    """One replay of ``trace`` with caching ``mode``; the summary fields (``status`` "ok" or the error)."""
    try:
        served.wait_idle()
        served.call(set_caching, mode == "on")
        records, meta = worker.run(served.base_url, trace, workdir, deadline_s, name=f"{load}_{mode}")
        served.wait_idle()
        time.sleep(gauge_period_s + 0.2)  # the engine loop refreshes the gauge this often
        stats = served.call(engine_stats)
        # a second round trip: an engine process sends the gauges its first round refreshed after that round's
        # result, and the pipe keeps order, so by this reply /metrics holds them
        served.call(engine_state)
        duration = meta.get("duration_s")
        ok = records[records["ok"].astype(bool)]
        row = summarize(records, duration_s=duration)
        row.update(
            {
                "duration_s": duration,
                "prompt_throughput_tok_s": ok["prompt_tokens"].sum() / duration if duration else np.nan,
                # with caching off the engine reports no hit rate and the gauge keeps its last value
                "hit_rate_metrics": read_gauge(served.base_url, HIT_RATE_GAUGE) if mode == "on" else np.nan,
                "hit_rate_engine": stats.get("prefix_hit_rate", np.nan),
                "block_hit_rate_engine": stats.get("prefix_block_hit_rate", np.nan),
                "prompt_tokens": int(records["prompt_tokens"].sum()),
                "status": "ok",
            }
        )
        per_request.append(request_metrics(records).drop(columns=["itl"]).assign(load=load, caching=mode))
        return row
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, not fatal
        status = f"error: {type(e).__name__}: {e}"[:300]
        log(f"{load}, caching {mode}: {status}")
        return {"status": status}


def _warm_up(served: ServedEngine, worker, trace: Trace, workdir: Path, deadline_s: float) -> float:
    """One untimed request through the server and the load worker, then idle; its wall time (s)."""
    t = time.perf_counter()
    records, _ = worker.run(served.base_url, trace.head(1), workdir, deadline_s, name="warmup")
    if not records["ok"].astype(bool).all():
        raise RuntimeError(f"warm-up request failed: {records['error'].iloc[0]}")
    served.wait_idle()
    return time.perf_counter() - t


def _status_rows(traces: dict[str, Trace], caching, status: str, done=frozenset()) -> list[dict]:
    """A summary row with ``status`` for every (load, caching) not in ``done``: runs that did not happen."""
    return [
        {"load": load, "caching": mode, "requests": len(trace), "status": status}
        for load, trace in traces.items()
        for mode in caching
        if (load, mode) not in done
    ]


def serve_comparison(
    engine: Engine | None,
    traces: dict[str, Trace],
    workdir,
    *,
    deadline_s: float,
    build=None,
    caching=CACHING,
    budget: Budget | None = None,
    run_estimate_s: float = 0.0,
    build_estimate_s: float = 0.0,
    progress: bool = True,
    log=print,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay each trace (``{load name: Trace}``) through the HTTP server once per caching setting. Returns the
    per-request metrics (``request_metrics`` + ``load``, ``caching``) and one summary row per (load, caching):
    ``summarize`` keys, prompt-token throughput, hit rates from ``/metrics`` and from the engine, ``status``.
    The engine is served in a process of its own when ``build`` (picklable: it builds the engine there) is
    given, else ``engine`` in this process.

    Before the timed runs, one request (the first trace's first) goes through the same HTTP path and load worker,
    untimed, so that the first timed run (caching off) does not take the server's and the pipe's first-call costs
    alone; each run then starts with the cache as ``set_caching`` leaves it, empty. ``budget``: a load's two runs
    (off, on) are run or skipped together, as the comparison needs both, when fewer than ``run_estimate_s`` seconds
    per run are left; where not even one load and the server's start (``build_estimate_s``) fit, no server starts."""
    from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

    workdir = Path(workdir)
    per_request, summary = [], []
    pair_s = len(caching) * run_estimate_s
    if budget is not None and budget.spent(build_estimate_s + pair_s):
        return pd.DataFrame(), pd.DataFrame(_status_rows(traces, caching, SKIPPED))
    bar = tqdm(total=len(traces) * len(caching), desc="server runs", disable=not progress)
    try:
        from servelab.loadgen.worker import LoadWorker
        from servelab.server.engine_loop import HIT_RATE_PERIOD_S

        with LoadWorker() as worker, ServedEngine(None if build is not None else engine, build) as served:
            warmup_s = _warm_up(served, worker, next(iter(traces.values())), workdir, deadline_s)
            # the HTTP server shares this interpreter with the notebook's objects (an engine, its model): a full
            # collection over them paused its intake of a burst for 0.17-0.26 s on a CPU, so they are frozen while
            # the runs are timed, as Study 1's points and the `servelab serve` command do (server.heap)
            freeze_heap()
            for load, trace in traces.items():
                skip = budget is not None and budget.spent(pair_s)  # both settings of a load, or neither
                for mode in caching:
                    row = {"load": load, "caching": mode, "requests": len(trace), "warmup_s": warmup_s}
                    if skip:
                        row["status"] = SKIPPED
                    else:
                        row.update(
                            _one_run(
                                served,
                                worker,
                                trace,
                                workdir,
                                deadline_s,
                                load,
                                mode,
                                per_request,
                                HIT_RATE_PERIOD_S,
                                log,
                            )
                        )
                    summary.append(row)
                    bar.update(1)
    except Exception as e:  # noqa: BLE001 - the server or the load generator did not start: say so, go on
        status = f"error: {type(e).__name__}: {e}"[:300]
        log(f"server-level runs: {status}")
        summary += _status_rows(traces, caching, status, done={(r["load"], r["caching"]) for r in summary})
    bar.close()
    gc.unfreeze()  # (the runs' failures are caught above, so this is reached)
    return (pd.concat(per_request, ignore_index=True) if per_request else pd.DataFrame()), pd.DataFrame(summary)
