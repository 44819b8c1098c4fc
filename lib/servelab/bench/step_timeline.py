"""One step's timeline from a ``torch.profiler`` trace: its kernels by class, GPU span, idle gaps and host time.

The profiled calls are each wrapped in a ``record_function`` range named ``CALL + str(i)`` that ends after a device
synchronisation, and the sampler inside each in ``SAMPLING`` (``step_budget.budget_call``). The trace is read as
Kineto writes it (``prof.export_chrome_trace``: complete events with ``cat``, ``ts`` and ``dur`` in µs, and a
``correlation`` id joining a device event to the runtime or driver call that launched it):

- **device events** (``kernel``, ``gpu_memcpy``, ``gpu_memset``) belong to the call whose range holds their
  launch. A CUDA graph's kernels share the correlation id of its ``cudaGraphLaunch`` (that is how they are marked
  ``in_graph``); one with no launch in the trace is placed by its own start instead, between one call's start and
  the next (the synchronisation inside each range keeps calls from overlapping on the GPU);
- with no device event at all (a CPU run), the "kernels" are the outermost aten operators inside each range;
- a call whose range holds a graph launch but no device event from it is flagged: the profiler did not see
  inside the graph (``StepBudget.graph_kernels_hidden``), and its class times would be missing that graph's work.

Per call: **GPU span**, first device event start to last end; **busy**, the union of the device events'
intervals (overlapping kernels counted once); **idle gap** = span − busy; the same inside the graph's own
kernels (**graph idle**: idle gaps inside the captured graph); **host** = the range's wall time − span: the
synchronised call's time with nothing of it on the GPU (building inputs, launching, returning from the sync).
Each event's **busy time** is what it adds to that union, walked in start order (``exclusive_us``): its duration
where events run one after another, and only the part past every earlier event's end where they overlap. With
programmatic dependent launch (``kernels/pdl.py``) they do, on one stream: a launch starts while the one before it
drains, and waits; its raw duration would count that wait and the overlap twice, and the classes would add to
more than the step. So the classes' busy times add up to the busy union. The calls' values are averaged, so the
parts still add up.

Per kernel (``kernel_table``): each distinct kernel name of the calls, its class, launches and busy time per call
and one launch's mean time, so the classes can be read down to the kernels that fill them.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.bench.kernel_classes import CLASSES, SAMPLING_PHASE, classify

CALL = "step_budget/call#"
SAMPLING = "step_budget/sampling"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
GRAPH_LAUNCH = re.compile(r"^cu(da)?GraphLaunch")
KERNEL_COLUMNS = ["call", "name", "start_us", "end_us", "cls", "in_graph", "launched"]
# a kernel's name as the CSV keeps it: C++ template arguments make torch's own kernels' names run to 1,000 characters
KERNEL_NAME_CHARS = 200


def read_trace(prof) -> list[dict]:
    """The profiler's events as Kineto exports them (the ``traceEvents`` of its Chrome trace)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def complete_events(events: list[dict]) -> pd.DataFrame:
    """The trace's complete (``ph == "X"``) events: cat, name, tid, start_us, end_us, correlation."""
    rows = [
        {
            "cat": str(e.get("cat", "")).lower(),
            "name": str(e.get("name", "")),
            "tid": e.get("tid"),
            "start_us": float(e["ts"]),
            "end_us": float(e["ts"]) + float(e.get("dur", 0.0)),
            "correlation": (e.get("args") or {}).get("correlation"),
        }
        for e in events
        if e.get("ph") == "X" and "ts" in e
    ]
    cols = ["cat", "name", "tid", "start_us", "end_us", "correlation"]
    return pd.DataFrame(rows, columns=cols)


def call_windows(ev: pd.DataFrame) -> pd.DataFrame:
    """The profiled calls' ranges, in order: call, start_us, end_us, tid."""
    marks = ev[(ev.cat == "user_annotation") & ev.name.str.startswith(CALL)]
    w = marks.assign(call=marks.name.str.slice(len(CALL)).astype(int))
    return w[["call", "start_us", "end_us", "tid"]].sort_values("start_us").reset_index(drop=True)


def _inside(times: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Whether each time lies inside any of ``ranges`` (start_us, end_us)."""
    hit = np.zeros(len(times), dtype=bool)
    for s, e in zip(ranges.start_us, ranges.end_us, strict=True):
        hit |= (times >= s) & (times <= e)
    return hit


def _call_of(times: np.ndarray, windows: pd.DataFrame, *, within: bool) -> np.ndarray:
    """The call each time falls in (-1: none). ``within``: inside the call's range (a launch on the host);
    otherwise anywhere from its start to the next call's (a device event placed by its own start)."""
    starts = windows.start_us.to_numpy()
    i = np.searchsorted(starts, times, side="right") - 1
    ok = i >= 0
    if within:
        ok &= times <= windows.end_us.to_numpy()[np.clip(i, 0, None)]
    return np.where(ok, windows.call.to_numpy()[np.clip(i, 0, None)], -1)


def device_kernels(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Every device event of the profiled calls, with its call, class and whether a graph launch ran it."""
    dev = ev[ev.cat.isin(DEVICE_CATS)]
    launches = ev[ev.cat.isin(LAUNCH_CATS) & ev.correlation.notna()].drop_duplicates("correlation")
    launch = dev.merge(
        launches[["correlation", "name", "start_us"]].rename(columns={"name": "launch", "start_us": "launch_us"}),
        on="correlation",
        how="left",
    )
    launched = launch.launch_us.notna().to_numpy()
    by_launch = _call_of(launch.launch_us.fillna(-np.inf).to_numpy(), windows, within=True)
    by_start = _call_of(launch.start_us.to_numpy(), windows, within=False)
    sampling = ev[(ev.cat == "user_annotation") & (ev.name == SAMPLING)]
    in_sampling = launched & _inside(launch.launch_us.fillna(-np.inf).to_numpy(), sampling)
    out = pd.DataFrame(
        {
            "call": np.where(launched, by_launch, by_start),
            "name": launch.name.to_numpy(),
            "start_us": launch.start_us.to_numpy(),
            "end_us": launch.end_us.to_numpy(),
            "cls": [classify(n, SAMPLING_PHASE if s else "") for n, s in zip(launch.name, in_sampling, strict=True)],
            "in_graph": launch.launch.fillna("").str.match(GRAPH_LAUNCH).to_numpy(),
            "launched": launched,
        }
    )
    return out[out.call >= 0].reset_index(drop=True)


def outermost_ops(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """A CPU run's "kernels": the outermost aten operators inside each call's range, on the call's thread."""
    sampling = ev[(ev.cat == "user_annotation") & (ev.name == SAMPLING)]
    rows = []
    for w in windows.itertuples():
        ops = ev[(ev.cat == "cpu_op") & (ev.tid == w.tid) & (ev.start_us >= w.start_us) & (ev.end_us <= w.end_us)]
        ops = ops.sort_values(["start_us", "end_us"], ascending=[True, False])
        reach = -np.inf  # the end of the outermost operator so far: one that starts before it is nested in it
        for op in ops.itertuples():
            if op.start_us < reach:
                continue
            reach = op.end_us
            phase = SAMPLING_PHASE if _inside(np.array([op.start_us]), sampling)[0] else ""
            rows.append((w.call, op.name, op.start_us, op.end_us, classify(op.name, phase), False, True))
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)


def exclusive_us(starts, ends) -> np.ndarray:
    """What each interval [start, end) adds to the union of those before it in start order (ties: the longer
    first), in the given order: its length where none overlaps it, 0 where an earlier one covers it."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    out = np.zeros(len(starts))
    reach = -np.inf
    for i in np.lexsort((-ends, starts)):
        out[i] = max(0.0, ends[i] - max(starts[i], reach))
        reach = max(reach, ends[i])
    return out


def union_us(starts, ends) -> float:
    """The length of the union of intervals [start, end): overlapping intervals counted once."""
    return float(exclusive_us(starts, ends).sum())


def _span_and_busy(k: pd.DataFrame) -> tuple[float, float]:
    if k.empty:
        return 0.0, 0.0
    return k.end_us.max() - k.start_us.min(), union_us(k.start_us, k.end_us)


@dataclass(frozen=True)
class StepBudget:
    """Where a step's time went, per call (µs averaged over the profiled calls, shown in ms)."""

    calls: int
    classes: pd.DataFrame  # index: CLASSES; kernels (per call), busy_ms (per call)
    wall_ms: float  # the synchronised call's wall time under the profiler
    gpu_span_ms: float
    busy_ms: float  # union of the device events' intervals
    idle_gap_ms: float  # gpu_span - busy
    graph_span_ms: float  # first to last kernel a graph launch ran (NaN: no graph kernel seen)
    graph_idle_ms: float  # graph_span - the union of the graph's kernels: idle gaps inside the captured graph
    host_ms: float  # wall - gpu_span
    graph_launches: float  # per call
    graph_kernels_hidden: bool  # a graph ran but none of its kernels is in the trace
    kernels: pd.DataFrame | None = None  # kernel_table: per kernel name, launches and busy time per call


def kernel_table(kernels: pd.DataFrame, calls: int) -> pd.DataFrame:
    """Per distinct kernel (its name cut to ``KERNEL_NAME_CHARS``) of ``calls`` profiled calls: its class, launches
    and busy ms per call (from ``busy_us``), one launch's mean µs; the busiest first."""
    k = kernels.assign(kernel=kernels.name.str.slice(0, KERNEL_NAME_CHARS), us=kernels.busy_us)
    g = k.groupby(["cls", "kernel"], sort=False).us.agg(["count", "sum"]).reset_index()
    out = pd.DataFrame(
        {
            "class": g.cls,
            "kernel": g.kernel,
            "launches": g["count"] / calls,
            "busy_ms": g["sum"] / calls / 1e3,
            "launch_us": g["sum"] / g["count"],
        }
    )
    return out.sort_values(["busy_ms", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)


def call_budget(kernels: pd.DataFrame, window) -> dict:
    """One call's span, busy, idle and graph figures in µs, and each class's kernel count and busy time (``kernels``
    with their ``busy_us``)."""
    span, busy = _span_and_busy(kernels)
    graph = kernels[kernels.in_graph]
    g_span, g_busy = _span_and_busy(graph)
    row = {
        "wall": window.end_us - window.start_us,
        "span": span,
        "busy": busy,
        "graph_span": g_span if len(graph) else np.nan,
        "graph_busy": g_busy if len(graph) else np.nan,
        "graph_kernels": len(graph),
        "unlaunched": int((~kernels.launched).sum()),
    }
    for cls in CLASSES:
        mine = kernels[kernels.cls == cls]
        row[f"n_{cls}"] = len(mine)
        row[f"busy_{cls}"] = float(mine.busy_us.sum())
    return row


def _exclusive(kernels: pd.DataFrame) -> np.ndarray:
    """Each event's busy time (``exclusive_us``) within its own call: calls never share a union."""
    out = np.zeros(len(kernels))
    calls = kernels.call.to_numpy()
    for call in np.unique(calls):
        at = calls == call
        out[at] = exclusive_us(kernels.start_us.to_numpy()[at], kernels.end_us.to_numpy()[at])
    return out


def step_budget(events: list[dict]) -> StepBudget:
    """The budget of the calls profiled in ``events`` (a trace's ``traceEvents``)."""
    ev = complete_events(events)
    windows = call_windows(ev)
    if windows.empty:
        raise ValueError(f"no profiled call in the trace: expected user annotations named {CALL}<i>")
    device = ev.cat.isin(DEVICE_CATS).any()
    kernels = device_kernels(ev, windows) if device else outermost_ops(ev, windows)
    kernels = kernels.assign(busy_us=_exclusive(kernels))  # each event's share of its call's busy union
    graph_launches = ev[ev.cat.isin(LAUNCH_CATS) & ev.name.str.match(GRAPH_LAUNCH)]
    launch_call = _call_of(graph_launches.start_us.to_numpy(), windows, within=True)
    calls = pd.DataFrame(
        [
            call_budget(kernels[kernels.call == w.call], w) | {"graph_launches": int((launch_call == w.call).sum())}
            for w in windows.itertuples()
        ]
    )
    mean = calls.mean(numeric_only=True)
    hidden = bool(((calls.graph_launches > 0) & (calls.graph_kernels == 0) & (calls.unlaunched == 0)).any())
    classes = pd.DataFrame(
        {"kernels": [mean[f"n_{c}"] for c in CLASSES], "busy_ms": [mean[f"busy_{c}"] / 1e3 for c in CLASSES]},
        index=pd.Index(CLASSES, name="class"),
    )
    return StepBudget(
        calls=len(calls),
        classes=classes,
        wall_ms=mean.wall / 1e3,
        gpu_span_ms=mean.span / 1e3,
        busy_ms=mean.busy / 1e3,
        idle_gap_ms=(mean.span - mean.busy) / 1e3,
        graph_span_ms=calls.graph_span.mean() / 1e3,
        graph_idle_ms=(calls.graph_span - calls.graph_busy).mean() / 1e3,
        host_ms=(mean.wall - mean.span) / 1e3,
        graph_launches=float(mean.graph_launches),
        graph_kernels_hidden=hidden,
        kernels=kernel_table(kernels, len(calls)),
    )
