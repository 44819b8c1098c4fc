"""The discrete-event simulator: a trace in, per-request records out, with the engine's own schedulers.

    run = simulate(trace, scheduler="chunked_prefill", cost=StepCostModel.load(path), replicas=8,
                   router="least_outstanding", max_num_batched_tokens=512)
    run.records        # the load generator's schema: arrival_s, sent_s, first_token_s, finish_s, token_times_s, ...
    run.summary()      # servelab.loadgen.metrics.summarize of those records

Two kinds of events, kept in time order: arrivals (from the trace, in order) and the ends of replica steps
(a heap of ``(time, order, replica, version)``). An arrival at the same instant as a step end is handled
first, as the engine adds the requests that came in before it schedules its next step. Time advances by the
cost model's prediction of each step; requests reach their replica ``cost.ingress_ms`` after they are sent.
Deterministic: no randomness, ties broken by trace order and replica index.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from servelab.engine.policies import make_scheduler
from servelab.engine.sequence import SamplingParams
from servelab.errors import ParameterError
from servelab.kv.block_manager import BlockManager
from servelab.kv.prefix_cache import PrefixCache
from servelab.loadgen.workload import Trace
from servelab.sim.cost_model import StepCostModel
from servelab.sim.records import RequestBook, compact_metrics, compact_summary, records_frame, summarize
from servelab.sim.replica import Replica, SimBlockManager, SimSequence
from servelab.sim.routers import make_router

DEFAULT_NUM_BLOCKS = 65536  # KV blocks per replica when not given: 1M tokens at block size 16 (rarely binding)
STEP_COLUMNS = [
    "replica",
    "start_s",
    "end_s",
    "prefill_tokens",
    "decode_tokens",
    "num_seqs",
    "num_waiting",
    "num_preempted",
    "decode_steps",
    "prefill_context_tokens",
    "decode_context_tokens",
]


@dataclass
class SimRun:
    """The outcome of one simulation."""

    records: pd.DataFrame  # loadgen schema + replica
    steps: pd.DataFrame | None  # per step (or fused decode run: decode_steps > 1), when step_log=True
    max_gap_s: np.ndarray  # per request: largest gap between two of its tokens (s)
    params: dict = field(default_factory=dict)
    wall_s: float = 0.0  # how long the simulation itself took (s)
    num_steps: int = 0
    prefix_hit_rate: float = float("nan")  # prompt tokens found in the replicas' prefix caches / looked up

    @property
    def has_token_times(self) -> bool:
        return self.params.get("token_times", True)

    def request_metrics(self) -> pd.DataFrame:
        """Per request ``ttft_ms, tpot_ms, e2e_ms, max_itl_ms`` (vectorised; no per-token lists)."""
        return compact_metrics(self.records, self.max_gap_s)

    def summary(self, *, slo_ttft_ms=None, slo_tpot_ms=None, duration_s=None) -> dict:
        """``servelab.loadgen.metrics.summarize`` of the records (the real load generator's table); without
        token times, the same keys from compact metrics (ITL percentiles NaN)."""
        if self.has_token_times:
            return summarize(
                self.records.drop(columns="replica"),
                slo_ttft_ms=slo_ttft_ms,
                slo_tpot_ms=slo_tpot_ms,
                duration_s=duration_s,
            )
        r = self.records
        return compact_summary(
            self.request_metrics(),
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            duration_s=duration_s,
            first_sent_s=float(r["sent_s"].min()),
            last_finish_s=float(r["finish_s"].max()),
        )


def as_trace(trace) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, pd.DataFrame):
        return Trace(trace)
    raise ParameterError(f"trace must be a servelab.loadgen.workload.Trace or a DataFrame, got {type(trace).__name__}")


def simulate(
    trace,
    *,
    cost: StepCostModel,
    scheduler: str = "chunked_prefill",
    replicas: int = 1,
    router: str = "round_robin",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    block_size: int = 16,
    token_times: bool = True,
    step_log: bool = False,
    fast_forward: bool = True,
    prefix_k: int = 32,
    prefix_caching: bool = False,
    prefix_eviction: str = "lru",
    step_buckets=None,
    progress: bool = False,
) -> SimRun:
    """Replay ``trace`` (a ``Trace`` or a DataFrame with ``arrival_s, prompt_tokens, output_tokens``, optional
    ``sent_s`` (when the request really left the client; default ``arrival_s``), ``prompt_ids`` or
    ``prefix_group`` (for the prefix-affinity router)) on
    ``replicas`` simulated servers, each running policy ``scheduler`` with the given limits.

    ``token_times=False`` keeps per request only first token, finish and the largest gap (long runs);
    ``step_log=True`` records every step; ``fast_forward=False`` steps one at a time (slow; for checks).
    ``prefix_caching=True`` gives every replica the engine's prefix cache (``servelab.kv.prefix_cache``,
    eviction ``prefix_eviction``) over the trace's ``prompt_ids``: cached prompt blocks are not prefilled again.
    ``step_buckets``: the token counts of the server's captured step graphs
    (``servelab.engine.step_graphs.step_graph_sizes(max_num_batched_tokens)``); a step pays for its bucket's
    padding (``StepCostModel.pad_tokens``). None: the cost model's own (none unless it was given some).
    """
    if not isinstance(cost, StepCostModel):
        raise ParameterError(f"cost must be a StepCostModel, got {type(cost).__name__}")
    if step_buckets is not None:
        cost = cost.with_step_buckets(step_buckets)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ParameterError(f"replicas must be a positive integer, got {replicas!r}")
    tr = as_trace(trace)
    df = tr.frame
    n = len(df)
    sent = df["sent_s"].to_numpy(dtype=float) if "sent_s" in df.columns else df["arrival_s"].to_numpy(dtype=float)
    if n and (not np.all(np.isfinite(sent)) or np.any(sent < 0)):
        raise ParameterError("sent_s must be finite and >= 0")
    at = sent + cost.ingress_ms / 1e3  # when each request reaches its replica's queue
    order = np.argsort(at, kind="stable")
    prompt = df["prompt_tokens"].to_numpy()
    output = df["output_tokens"].to_numpy()
    book = RequestBook(n, token_times=token_times)
    log: list | None = [] if step_log else None
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive integer, got {v!r}")
    if prefix_caching and not tr.has_prompt_ids:
        raise ParameterError("prefix_caching needs the prompts' token ids (a prompt_ids column in the trace)")
    ids = df["prompt_ids"].tolist() if prefix_caching else None

    def block_manager():
        if not prefix_caching:
            return SimBlockManager(num_blocks, block_size)
        return BlockManager(num_blocks, block_size, PrefixCache(block_size, prefix_eviction))

    reps = [
        Replica(
            r,
            make_scheduler(
                scheduler,
                block_manager=block_manager(),
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
            ),
            cost,
            book,
            fast_forward=fast_forward,
            step_log=log,
        )
        for r in range(replicas)
    ]
    rt = make_router(
        router,
        reps,
        prompt_ids=df["prompt_ids"].tolist() if tr.has_prompt_ids else None,
        prefix_groups=df["prefix_group"].to_numpy() if "prefix_group" in df.columns else None,
        prefix_k=prefix_k,
    )
    reads_load = rt.reads_load
    params_cache: dict[int, SamplingParams] = {}
    heap: list[tuple[float, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    tie = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, unit="req", desc=f"simulate {scheduler} × {replicas}", mininterval=0.5)
    wall0 = time.perf_counter()
    i = 0
    at_list = at[order].tolist()
    idx_list = order.tolist()
    while i < n or heap:
        if i < n and (not heap or at_list[i] <= heap[0][0]):
            t, j = at_list[i], idx_list[i]
            i += 1
            if reads_load:
                for rp in reps:
                    if rp.next_finish_s < t:  # (otherwise its count is up to date)
                        rp.sync_outstanding(t)
            r = rt.route(j)
            rep = reps[r]
            book.replica[j] = r
            m = int(output[j])
            sp = params_cache.get(m)
            if sp is None:
                sp = params_cache[m] = SamplingParams(max_tokens=m, ignore_eos=True)
            try:
                rep.add(SimSequence(j, int(prompt[j]), sp, t, None if ids is None else list(ids[j])))
            except ParameterError as e:  # the real server answers 400: the request fails, nothing is queued
                book.errors[j] = str(e)
                continue
            if rep.busy:
                end = rep.cut(t)
                if end is not None:
                    tie += 1
                    push(heap, (end, tie, r, rep.version))
            elif not rep.scheduled_wake:
                rep.scheduled_wake = True
                tie += 1
                push(heap, (t, tie, r, rep.version))
            if bar is not None and i % 2000 == 0:
                bar.update(2000)
            continue
        t, _, r, ver = pop(heap)
        rep = reps[r]
        if ver != rep.version:
            continue  # a run that was cut short: its old end is void
        rep.scheduled_wake = False
        if rep.busy:
            rep.complete(t)
        end = rep.start(t)
        if end is not None:
            tie += 1
            push(heap, (end, tie, r, rep.version))
    wall = time.perf_counter() - wall0
    if bar is not None:
        bar.update(n - bar.n)
        bar.close()
    records = records_frame(book, df, sent)
    steps = pd.DataFrame(log, columns=STEP_COLUMNS) if log is not None else None
    params = {
        "scheduler": scheduler,
        "replicas": replicas,
        "router": router,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "token_times": token_times,
        "fast_forward": fast_forward,
        "cost": cost.source,
        "prefix_caching": prefix_caching,
        "step_buckets": list(cost.step_buckets),
    }
    caches = [rp.scheduler.bm.prefix_cache for rp in reps if rp.scheduler.bm.prefix_cache is not None]
    queried = sum(c.queried_tokens for c in caches)
    hit_rate = sum(c.hit_tokens for c in caches) / queried if queried else float("nan")
    return SimRun(records, steps, np.asarray(book.max_gap_s), params, wall, sum(rp.num_steps for rp in reps), hit_rate)
