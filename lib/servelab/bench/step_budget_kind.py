"""One step kind's budget: the engine's step timed, profiled, split into kernel classes and set beside its floors.

The step is built by ``servelab.bench.step.engine_step`` in the engine's default configuration (attention backend
and ``torch.compile`` on "auto"; a decode graph or a whole-step graph for the step, on the smallest engine that
holds it, its KV pool sized for the step's contexts). What is timed is what ``ModelRunner.launch`` enqueues for a
step: the forward ``engine_step`` returns (a graph replay with its input copies on a GPU), the engine's sampler on its
logits, and the copy of the sampled tokens to the host (``budget_call``). Scheduling is not in it.

Per step kind (``measure_kind``), each a column of its rows:

- ``step_ms``: CUDA events around back-to-back calls, median of ``repeats`` (``time_fn``, as every engine row is
  timed); ``forward_ms``: the forward alone the same way, which is the benchmark's ``decode_ms_*`` row;
- ``wall_ms`` and ``launch_ms``: ``perf_counter`` from a call that starts with the device idle until it is
  synchronised, and until the call returns (the host's share), medians;
- from a ``torch.profiler`` trace of ``profiled_calls`` calls (``step_timeline``): each class's kernels and busy
  time, the GPU span, the idle gaps in all and inside the captured graph, the host time; ``profiled_wall_ms`` is the
  synchronised call under the profiler, whose parts these are (busy + idle + host);
- each class's floor (``step_floors``) at the ceilings measured in the same run; ``step_floor_ms`` is their sum,
  ``roofline_floor_ms`` the whole step's ``max(FLOPs / peak, bytes / bandwidth)``.

Per kernel (``kernel_rows``, ``step_kernels.csv``): each distinct kernel name of the profiled calls with its class,
launches and busy ms per step and one launch's mean µs (``step_timeline.kernel_table``).

Where the profiler sees no kernel inside a CUDA graph, the classes come from the same step built without graphs
(the same kernels, launched one by one; ``profile_source`` says so), its idle gap is the step time less their busy
time, and its host time the wall time less the step time: the parts then add up to ``wall_ms``, which
``profiled_wall_ms`` repeats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from dataclasses import dataclass

from servelab.bench.kernel_classes import CLASSES
from servelab.bench.step_floors import class_floors, class_work
from servelab.bench.step_timeline import CALL, SAMPLING, StepBudget, read_trace, step_budget

NAN = float("nan")
KERNEL_COLUMNS = ["step", "kind", "rank", "class", "kernel", "launches", "busy_ms", "launch_us", "profile_source"]
AS_RUN = "as run"
EAGER = "the same step built without CUDA graphs: the profiler saw no kernel inside the graph"


@dataclass(frozen=True)
class StepKind:
    """A step as ``engine_step`` builds it: ``batch`` sequences of ``new_tokens`` after ``context`` cached each, and
    a mixed step's ``decodes`` at ``decode_context``."""

    batch: int
    new_tokens: int
    context: int
    decodes: int = 0
    decode_context: int = 0

    @property
    def kind(self) -> str:
        from servelab.bench.step import step_kind

        return step_kind(self.batch, self.new_tokens, self.context, self.decodes, self.decode_context)

    @property
    def name(self) -> str:
        if self.decodes:
            return f"mixed_d{self.decodes}_ctx{self.decode_context}_chunk{self.new_tokens}"
        if self.new_tokens == 1 and self.context:
            return f"decode_b{self.batch}_ctx{self.context}"
        return f"prefill_b{self.batch}_{self.new_tokens}" + (f"_ctx{self.context}" if self.context else "")

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens + self.decodes

    def columns(self) -> dict:
        return {"step": self.name, "kind": self.kind, **dataclasses.asdict(self), "tokens": self.tokens}


def budget_call(engine, step, *, mark: bool = False):
    """``call()``: the engine's forward for ``step``, its sampler, the tokens' copy to the host (``launch``'s work);
    ``mark`` puts the sampler in a ``SAMPLING`` range, so that the trace tells its kernels from the forward's."""
    import torch
    from torch.profiler import record_function

    from servelab.engine.sampling import sample_step

    runner = engine.runner

    @torch.inference_mode()
    def call():
        logits, items = runner.logits(step)
        with record_function(SAMPLING) if mark else contextlib.nullcontext():
            tokens, _ = sample_step(logits, [it.seq for it in items], runner.race, runner.eos_token_ids)
        return runner.staging.stage(step, items, tokens, None)

    return call


def wall_and_launch_ms(call, repeats: int, sync) -> tuple[float, float]:
    """Median ms of a call that starts with the device idle: until synchronised, and until it returns."""
    walls, launches = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        sync()
        walls.append(time.perf_counter() - t0)
        launches.append(t1 - t0)
    return statistics.median(walls) * 1e3, statistics.median(launches) * 1e3


def profile_budget(call, calls: int, cuda: bool, sync) -> StepBudget:
    """``calls`` synchronised calls under ``torch.profiler`` (CPU, and CUDA on a GPU), each in its ``CALL`` range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        call()  # the first call under a profiler pays its start-up (CUPTI's buffers): outside every range read
        for i in range(calls):
            sync()
            with record_function(f"{CALL}{i}"):
                call()
                sync()
    return step_budget(read_trace(prof))


def _build(session, kind: StepKind, graphs: bool):
    from servelab.bench.step import engine_step

    k = kind
    return engine_step(
        session.model,
        k.batch,
        k.new_tokens,
        k.context,
        decodes=k.decodes,
        decode_context=k.decode_context,
        seed=session.plan.seed,
        compile="auto",
        graphs=graphs,
    )[0]


def eager_budget(session, kind: StepKind, step_ms: float, wall_ms: float) -> StepBudget:
    """The classes of the step built without graphs; span, idle and host from the graphed step's own times."""
    fn = _build(session, kind, graphs=False)
    eager = profile_budget(budget_call(fn.engine, fn.step, mark=True), session.plan.profiled_calls, True, session.sync)
    return dataclasses.replace(
        eager,
        wall_ms=wall_ms,
        gpu_span_ms=NAN,
        idle_gap_ms=step_ms - eager.busy_ms,
        graph_span_ms=NAN,
        graph_idle_ms=NAN,
        host_ms=wall_ms - step_ms,
        graph_kernels_hidden=True,
    )


def kernel_rows(kind: StepKind, budget: StepBudget, source: str) -> list[dict]:
    """One row per distinct kernel of ``kind``'s profiled step, the busiest first (``step_kernels.csv``)."""
    if budget.kernels is None:
        return []
    return [
        {"step": kind.name, "kind": kind.kind, "rank": i, **r, "profile_source": source}
        for i, r in enumerate(budget.kernels.to_dict("records"))
    ]


def measure_kind(session, kind: StepKind, kernels_out: list | None = None) -> list[dict]:
    """One row per class of ``kind``'s step (``CLASSES``), each carrying the step's own figures; with ``kernels_out``,
    its kernels' rows (``kernel_rows``) are appended there."""
    from servelab.measure import time_fn

    p, sync = session.plan, session.sync
    fn = _build(session, kind, graphs=True)
    engine, step = fn.engine, fn.step
    spans = [(it.start, it.num_tokens) for it in step.items]  # (cached context, new tokens) of every item
    logits, items = engine.runner.logits(step)
    sampled, logits_bytes = len(items), logits.element_size()  # the rows that sample (the LM head's and sampler's)
    forward = time_fn(fn, warmup=3, repeats=p.repeats, device=p.device)
    call = budget_call(engine, step)
    whole = time_fn(call, warmup=3, repeats=p.repeats, device=p.device)
    wall, launch = wall_and_launch_ms(call, p.repeats, sync)
    budget = profile_budget(budget_call(engine, step, mark=True), p.profiled_calls, session.cuda, sync)
    source, path = AS_RUN, fn.path()
    st = engine.stats()
    note = f"backend {st['attention_backend']}, compile {st['compile']}, CUDA graphs {st['cuda_graphs']}"
    fn = call = engine = step = logits = items = None
    session.free()
    if budget.graph_kernels_hidden:
        budget, source = eager_budget(session, kind, whole.median_ms, wall), EAGER
    if kernels_out is not None:
        kernels_out += kernel_rows(kind, budget, source)
    work = class_work(session.shape, spans, sampled, session.dtype_bytes, logits_bytes)
    floors = class_floors(work, session.roof)
    total_flops = sum(w.flops for w in work.values())
    total_bytes = sum(w.nbytes for w in work.values())
    step_cols = {
        "sampled_rows": sampled,
        "step_ms": whole.median_ms,
        "step_p25_ms": whole.p25_ms,
        "step_p75_ms": whole.p75_ms,
        "forward_ms": forward.median_ms,
        "wall_ms": wall,
        "launch_ms": launch,
        "profiled_wall_ms": budget.wall_ms,
        "gpu_span_ms": budget.gpu_span_ms,
        "busy_union_ms": budget.busy_ms,
        "idle_gap_ms": budget.idle_gap_ms,
        "graph_span_ms": budget.graph_span_ms,
        "graph_idle_ms": budget.graph_idle_ms,
        "host_ms": budget.host_ms,
        "step_floor_ms": sum(f for f, _ in floors.values()),
        "roofline_floor_ms": float(session.roof.floor_ms(total_flops, total_bytes)),
        "graph_launches": budget.graph_launches,
        "path": path,
        "profile_source": source,
        "profiled_calls": budget.calls,
        "repeats": p.repeats,
        "status": "ok",
        "note": note,
    }
    return [
        kind.columns()
        | {
            "class": cls,
            "kernels": budget.classes.at[cls, "kernels"],
            "busy_ms": budget.classes.at[cls, "busy_ms"],
            "flops": work[cls].flops,
            "bytes": work[cls].nbytes,
            "floor_ms": floors[cls][0],
            "floor_bound": floors[cls][1],
        }
        | step_cols
        for cls in CLASSES
    ]


def failed_rows(kind: StepKind, status: str) -> list[dict]:
    """The rows of a step kind that was not measured (skipped, or failed: ``status`` says which and why)."""
    return [kind.columns() | {"class": cls, "status": status} for cls in CLASSES]
