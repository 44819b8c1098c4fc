"""The discrete-event simulator: a trace in, per-request records out, with the engine's own schedulers.

    run = simulate(trace, scheduler="chunked_prefill", cost=StepCostModel.load(path), replicas=8,
                   router="least_outstanding", max_num_batched_tokens=512)
    run.records        # the load generator's schema: arrival_s, sent_s, first_token_s, finish_s, token_times_s, ...
    run.summary()      # servelab.loadgen.metrics.summarize's keys for those records

Two kinds of events, kept in time order: arrivals (from the trace, in order) and the ends of replica steps
(a heap of ``(time, order, replica, version)``). An arrival at the same instant as a step end is handled
first, as the engine adds the requests that came in before it schedules its next step. Time advances by the
cost model's prediction of each step; requests reach their replica ``cost.ingress_ms`` after they are sent.
Deterministic: no randomness, ties broken by trace order and replica index; a request is known to the
engine's scheduler by its trace ``request_id`` (an error names it), so two simulations in one process agree.

``simulate`` checks its inputs, builds the replicas (``_replicas``) and the router, runs ``EventLoop`` and
assembles the ``SimRun``.
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
from servelab.loadgen.metrics import SUMMARY_KEYS, request_metrics, run_span_s, summarize_metrics
from servelab.loadgen.workload import Trace
from servelab.sim.cost_model import StepCostModel
from servelab.sim.records import RequestBook, compact_metrics, records_frame
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
        """The real load generator's summary (``servelab.loadgen.metrics.SUMMARY_KEYS``) of the records; without
        token times, ITL percentiles are NaN."""
        s = self.benchmark_summary(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, duration_s=duration_s)
        return {k: s[k] for k in SUMMARY_KEYS}

    def benchmark_summary(self, *, slo_ttft_ms=None, slo_tpot_ms=None, duration_s=None) -> dict:
        """``summary`` plus what vLLM's ``benchmark_serving`` prints (``servelab.loadgen.metrics.BENCHMARK_KEYS``),
        from the same ``summarize_metrics`` as the real load generator's."""
        r = self.records
        if duration_s is None:
            duration_s = run_span_s(r["sent_s"], r["finish_s"], r["ok"])
        elif isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
            raise ParameterError(f"duration_s must be a positive number or None, got {duration_s!r}")
        if self.has_token_times:
            m = request_metrics(r.drop(columns="replica"))
            itl = [g for ok, gaps in zip(m["ok"], m["itl"], strict=True) if ok for g in gaps]
        else:
            m, itl = self.request_metrics(), None
        return summarize_metrics(m, itl, duration_s=duration_s, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)


def as_trace(trace) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, pd.DataFrame):
        return Trace(trace)
    raise ParameterError(f"trace must be a servelab.loadgen.workload.Trace or a DataFrame, got {type(trace).__name__}")


def _check_positive_ints(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive integer, got {v!r}")


def _sent_times(frame: pd.DataFrame) -> np.ndarray:
    """When each request left the client (s): ``sent_s`` if the trace has it, else ``arrival_s``."""
    col = "sent_s" if "sent_s" in frame.columns else "arrival_s"
    sent = frame[col].to_numpy(dtype=float)
    if len(sent) and (not np.all(np.isfinite(sent)) or np.any(sent < 0)):
        raise ParameterError("sent_s must be finite and >= 0")
    return sent


class Requests:
    """The trace's requests as the replicas' schedulers receive them: a ``SimSequence`` named by its trace
    ``request_id`` (what a refusal's error quotes), with one shared ``SamplingParams`` per output length."""

    def __init__(self, frame: pd.DataFrame, prompt_ids: list | None):
        self.request_id = frame["request_id"].tolist()
        self.prompt = frame["prompt_tokens"].to_numpy()
        self.output = frame["output_tokens"].to_numpy()
        self.prompt_ids = prompt_ids
        self._params: dict[int, SamplingParams] = {}

    def sequence(self, j: int, t: float) -> SimSequence:
        """Request ``j`` (its row in the trace) reaching its replica at ``t`` (s)."""
        m = int(self.output[j])
        sp = self._params.get(m)
        if sp is None:
            sp = self._params[m] = SamplingParams(max_tokens=m, ignore_eos=True)
        ids = None if self.prompt_ids is None else list(self.prompt_ids[j])
        return SimSequence(j, int(self.prompt[j]), sp, t, ids, request_id=self.request_id[j])


class EventLoop:
    """Arrivals and the ends of replica steps, handled in time order (the module docstring says how ties go).

    The heap holds ``(time s, order, replica, version)``; an entry whose version is no longer its replica's
    (a run cut short by an arrival) is void."""

    def __init__(self, replicas: list[Replica], router, book: RequestBook, requests: Requests):
        self.reps = replicas
        self.router = router
        self.book = book
        self.requests = requests
        self.heap: list[tuple[float, int, int, int]] = []
        self._order = 0

    def _push(self, t: float, r: int, version: int) -> None:
        self._order += 1
        heapq.heappush(self.heap, (t, self._order, r, version))

    def arrive(self, t: float, j: int) -> None:
        """Request ``j`` reaches the router at ``t``: queued on its replica (which starts, or cuts its run short),
        or refused as the real server would answer 400 (the request fails, nothing is queued)."""
        reps = self.reps
        if self.router.reads_load:
            for rp in reps:
                if rp.next_finish_s < t:  # (otherwise its count is up to date)
                    rp.sync_outstanding(t)
        r = self.router.route(j)
        rep = reps[r]
        self.book.replica[j] = r
        try:
            rep.add(self.requests.sequence(j, t))
        except ParameterError as e:
            self.book.errors[j] = str(e)
            return
        if rep.busy:
            end = rep.cut(t)
            if end is not None:
                self._push(end, r, rep.version)
        elif not rep.scheduled_wake:
            rep.scheduled_wake = True
            self._push(t, r, rep.version)

    def step_end(self) -> None:
        """The earliest step end: its replica settles what ran and schedules what runs next."""
        t, _, r, ver = heapq.heappop(self.heap)
        rep = self.reps[r]
        if ver != rep.version:
            return  # a run that was cut short: its old end is void
        rep.scheduled_wake = False
        if rep.busy:
            rep.complete(t)
        end = rep.start(t)
        if end is not None:
            self._push(end, r, rep.version)

    def run(self, at: np.ndarray, bar=None) -> None:
        """Replay arrivals at ``at`` (s, per trace row) until every replica is idle; ``bar``: a tqdm to advance."""
        order = np.argsort(at, kind="stable")
        at_list, idx_list = at[order].tolist(), order.tolist()
        n, i, heap = len(at_list), 0, self.heap
        arrive, step_end = self.arrive, self.step_end
        while i < n or heap:
            if i < n and (not heap or at_list[i] <= heap[0][0]):
                arrive(at_list[i], idx_list[i])
                i += 1
                if bar is not None and i % 2000 == 0:
                    bar.update(2000)
            else:
                step_end()


def _replicas(
    n: int, scheduler: str, limits: dict, cost: StepCostModel, book: RequestBook, prefix: tuple | None, **kw
) -> list[Replica]:
    """``n`` replicas, each a ``make_scheduler(scheduler, **limits)`` over its own block manager: the engine's,
    with a prefix cache, when ``prefix`` is ``(num_blocks, block_size, eviction)``; else the simulator's."""

    def block_manager():
        if prefix is None:
            return SimBlockManager(limits["num_blocks"], limits["block_size"])
        num_blocks, block_size, eviction = prefix
        return BlockManager(num_blocks, block_size, PrefixCache(block_size, eviction))

    return [
        Replica(
            r,
            make_scheduler(
                scheduler,
                block_manager=block_manager(),
                max_num_seqs=limits["max_num_seqs"],
                max_num_batched_tokens=limits["max_num_batched_tokens"],
            ),
            cost,
            book,
            **kw,
        )
        for r in range(n)
    ]


def _hit_rate(replicas: list[Replica]) -> float:
    """Prompt tokens found in the replicas' prefix caches / looked up (NaN without caches)."""
    caches = [rp.scheduler.bm.prefix_cache for rp in replicas if rp.scheduler.bm.prefix_cache is not None]
    queried = sum(c.queried_tokens for c in caches)
    return sum(c.hit_tokens for c in caches) / queried if queried else float("nan")


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
    A request the scheduler refuses (it could never fit) is a failed record whose error names its ``request_id``.
    """
    if not isinstance(cost, StepCostModel):
        raise ParameterError(f"cost must be a StepCostModel, got {type(cost).__name__}")
    if step_buckets is not None:
        cost = cost.with_step_buckets(step_buckets)
    _check_positive_ints(replicas=replicas)
    tr = as_trace(trace)
    df = tr.frame
    sent = _sent_times(df)
    _check_positive_ints(num_blocks=num_blocks, block_size=block_size)
    if prefix_caching and not tr.has_prompt_ids:
        raise ParameterError("prefix_caching needs the prompts' token ids (a prompt_ids column in the trace)")
    book = RequestBook(len(df), token_times=token_times)
    log: list | None = [] if step_log else None
    limits = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "num_blocks": num_blocks,
        "block_size": block_size,
    }
    prefix = (num_blocks, block_size, prefix_eviction) if prefix_caching else None
    reps = _replicas(replicas, scheduler, limits, cost, book, prefix, fast_forward=fast_forward, step_log=log)
    rt = make_router(
        router,
        reps,
        prompt_ids=df["prompt_ids"].tolist() if tr.has_prompt_ids else None,
        prefix_groups=df["prefix_group"].to_numpy() if "prefix_group" in df.columns else None,
        prefix_k=prefix_k,
    )
    loop = EventLoop(reps, rt, book, Requests(df, df["prompt_ids"].tolist() if prefix_caching else None))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(df), unit="req", desc=f"simulate {scheduler} × {replicas}", mininterval=0.5)
    wall0 = time.perf_counter()
    loop.run(sent + cost.ingress_ms / 1e3, bar)  # requests reach their replica's queue after the ingress delay
    wall = time.perf_counter() - wall0
    if bar is not None:
        bar.update(len(df) - bar.n)
        bar.close()
    params = {
        "scheduler": scheduler,
        "replicas": replicas,
        "router": router,
        **limits,
        "token_times": token_times,
        "fast_forward": fast_forward,
        "cost": cost.source,
        "prefix_caching": prefix_caching,
        "step_buckets": list(cost.step_buckets),
    }
    steps = pd.DataFrame(log, columns=STEP_COLUMNS) if log is not None else None
    records = records_frame(book, df, sent)
    return SimRun(
        records, steps, np.asarray(book.max_gap_s), params, wall, sum(rp.num_steps for rp in reps), _hit_rate(reps)
    )
