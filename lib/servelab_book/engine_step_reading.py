"""What the step budget says stands in the way of each goal the engine benchmark misses.

Issue 29 asks that a missed goal be reported "with its measured number and what the step budget says stands in the
way". The goals table (``engine_prose.render_goals``) gives the number; this reads the step budget's row of the same
step kind (``step_budget.csv``) beside it: whether the step's time is its kernels' (the GPU busy through the step)
or the host's and the graph's gaps, which kernel classes run furthest above their floors, and which of them would
have to shrink, and by how much, for the goal to be met.

A goal and a step kind are matched by the metric's name (``MATCHES``); a missed goal with no step kind of its own
(the offline workload's mix of steps) says so rather than borrowing one. The budget is a separate run, on its own
model (``step_budget.run.json``'s ``params``), which the sentence names where it is not the benchmark row's (the
prefill MFU row runs on the benchmark's ``mfu_model``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from servelab.bench.kernel_classes import LABELS
from servelab.studies.common.markdown import format_value, md_text
from servelab_book.engine_bench import bench_provenance
from servelab_book.engine_prose import Goal, bench_rows, code, num
from servelab_book.engine_step_budget import ms_text, sidecar

INCLUDE = "engine_step_reading.md"

# metric name -> does a budget row (its first class row, the step's shape columns) time that metric's step?
MATCHES: tuple[tuple[re.Pattern, Callable[[re.Match, pd.Series], bool]], ...] = (
    (
        re.compile(r"decode_ms_b(\d+)_ctx(\d+)"),
        lambda m, s: s["kind"] == "decode" and s["batch"] == int(m[1]) and s["context"] == int(m[2]),
    ),
    (
        re.compile(r"prefill_mfu_(\d+)"),
        lambda m, s: s["kind"] == "prefill" and s["new_tokens"] == int(m[1]) and s["batch"] == 1 and s["context"] == 0,
    ),
    (
        re.compile(r"offline_budget(\d+)_ratio"),  # the budget-capped run's steps are mixed steps of that chunk
        lambda m, s: s["kind"] == "mixed" and s["new_tokens"] == int(m[1]),
    ),
)


def step_of(metric: str, steps: pd.DataFrame) -> str | None:
    """The budget's step kind that times ``metric``'s step (``steps``: one row per step kind), None if none."""
    for pattern, matches in MATCHES:
        m = pattern.fullmatch(metric)
        if m:
            hits = [s["step"] for _, s in steps.iterrows() if matches(m, s)]
            return hits[0] if hits else None
    return None


def share_to_cut(goal: Goal, value: float) -> float:
    """The fraction of the step's time that has to go for ``value`` to meet ``goal``, taking the metric as a time
    (an upper bound: ms a step) or as inversely proportional to one (a lower bound: tokens a second, a fraction of
    a ceiling, a ratio of throughputs)."""
    return 1.0 - (goal.target / value if goal.op == "<=" else value / goal.target)


def excesses(rows: pd.DataFrame) -> pd.DataFrame:
    """A step's kernel classes that ran, by how far their busy time stands above their floor, largest first."""
    ran = rows[rows["busy_ms"] > 0].copy()
    ran["excess_ms"] = (ran["busy_ms"] - ran["floor_ms"]).clip(lower=0.0)
    return ran.sort_values("excess_ms", ascending=False)


def _class_text(r) -> str:
    ratio = r.busy_ms / r.floor_ms if r.floor_ms > 0 else float("inf")
    floor = f"{ratio:.1f}× its floor" if ratio < 100 else f"its floor {ms_text(r.floor_ms)} ms"
    return (
        f"{LABELS[r['class']]} +{ms_text(r.excess_ms)} ms ({ms_text(r.busy_ms)} ms, {floor}, {r.kernels:.0f} kernels)"
    )


def where_the_time_goes(rows: pd.DataFrame) -> str:
    """One step kind's budget in a sentence: its time, how much of it the kernels fill, and the classes furthest
    above their floors."""
    first = rows.iloc[0]
    busy = float(first["busy_union_ms"])
    fill = busy / first["step_ms"]
    text = (
        f"its step takes {ms_text(first['step_ms'])} ms (CUDA events), and in a profiled call its kernels keep the GPU "
        f"busy for {ms_text(busy)} ms, {fill:.0%} of the step's time"
    )
    if fill >= 0.9:
        text += ": the time is the kernels' own, not the host's"
    else:
        text += f"; the rest is the GPU idle ({ms_text(first['graph_idle_ms'])} ms of it inside the captured graph)"
    top = excesses(rows).head(4)
    return text + "; above their floors: " + "; ".join(_class_text(r) for _, r in top.iterrows())


def what_would_have_to_go(rows: pd.DataFrame, need_ms: float) -> str:
    """Which classes' excess, largest first, covers ``need_ms``: the cut the goal asks for, in the budget's terms."""
    ex = excesses(rows)
    total = float(ex["excess_ms"].sum())
    if need_ms > total:
        return (
            f"more than every class's excess over its floor together ({ms_text(total)} ms): the goal is below what "
            "these kernels' floors allow at this shape"
        )
    cum = ex["excess_ms"].cumsum()
    k = int((cum < need_ms).sum()) + 1
    names = [LABELS[c] for c in ex["class"].head(k)]
    if k == 1:
        share = need_ms / float(ex["excess_ms"].iloc[0])
        return f"{share:.0%} of the {names[0]} excess alone"
    return f"the excess of {', '.join(names[:-1])} and {names[-1]} together ({ms_text(float(cum.iloc[k - 1]))} ms)"


def row_model(metric: str, bench_params: dict) -> str:
    """The model a benchmark row ran on: the MFU rows' own model, else the benchmark's."""
    key = "mfu_model" if metric.startswith("prefill_mfu") else "model"
    return str(bench_params.get(key) or bench_params.get("model") or "")


def render_step_reading(bench_csv: Path | None, budget_csv: Path | None) -> str:
    """A bullet per missed goal: what the budget's step of its kind says stands in the way ("" without both CSVs)."""
    rows = bench_rows(bench_csv)
    if not rows or budget_csv is None or not Path(budget_csv).exists():
        return ""
    prov = bench_provenance(Path(bench_csv))
    bench_params = (prov.params if prov is not None else None) or {}
    budget_model = str((sidecar(Path(budget_csv)).get("params") or {}).get("model") or "")
    budget = pd.read_csv(budget_csv)
    ok = budget[budget["status"] == "ok"] if "status" in budget.columns else budget
    if ok.empty:
        return ""
    steps = ok.groupby("step", sort=False).first().reset_index()
    lines = []
    for r in rows.values():
        goal, value = Goal.parse(r.get("goal", "")), num(r)
        if goal is None or value is None or goal.met(value):
            continue
        head = f"{code(r['metric'])}, {format_value(r['value'])} {r['unit']} against {goal}"
        step = step_of(r["metric"], steps)
        if step is None:
            lines.append(f"- {head}: no step kind of the budget is this workload's; it mixes steps of many shapes.")
            continue
        s = ok[ok["step"] == step]
        cut = share_to_cut(goal, value)
        need = cut * float(s.iloc[0]["step_ms"])
        model = row_model(r["metric"], bench_params)
        on = (
            f" (on {md_text(model)}; the budget's step is {md_text(budget_model)}'s)"
            if model and budget_model and model != budget_model
            else ""
        )
        lines.append(
            f"- {head}{on}: {md_text(where_the_time_goes(s))}. The goal needs the step {cut:.0%} shorter, "
            f"{ms_text(need)} ms: {md_text(what_would_have_to_go(s, need))}."
        )
    if not lines:
        return ""
    intro = (
        "Each goal the benchmark misses, read against the budget's step of the same kind (a separate run, so its "
        "step times differ from the benchmark's by a few percent; a class's excess is its busy time above its "
        "floor). A goal on a rate or a ratio is read as asking that step to be shorter in the same proportion, "
        "which holds for prefill MFU (its FLOPs are fixed) and is only a guide for the 512-token budget's "
        "throughput, which its mixed steps set only in part:\n\n"
    )
    return intro + "\n".join(lines) + "\n"
