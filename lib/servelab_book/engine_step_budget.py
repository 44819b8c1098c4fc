"""The engine page's step budget, from ``data/results/<h200 slug>/engine/step_budget.csv``
(``python -m servelab.bench.step_budget``): per step kind, its kernels' time by class, the GPU's idle gaps and the
host's time beside each class's floor, as a figure (``engine_step_budget_figure``) and a table; and, from
``step_kernels.csv`` beside it where the run wrote one, the busiest kernels of each step kind.

Nothing here is typed: without the CSV the include is one sentence saying the budget has not been measured on the
H200 yet, with the command that measures it, and there is no figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.bench.kernel_classes import CLASSES, LABELS
from servelab.measure.results import results_root
from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab_book.engine_freshness import freshness
from servelab_book.engine_step_budget_figure import figure_svg
from servelab_book.engine_tables import frame_table
from servelab_book.findings import BOOK_DEVICE

INCLUDE = "engine_step_budget.md"
FIGURE = "engine_step_budget.svg"
CSV = "step_budget.csv"
KERNELS_CSV = "step_kernels.csv"  # servelab.bench.step_budget's per-kernel rows (runs since 2026-12-07)
TOP_KERNELS = 3
SIDECAR = "step_budget.run.json"  # servelab.bench.step_budget's, beside the benchmark's own run.json
COMMAND = "python -m servelab.bench.step_budget --model config:qwen2-0.5b --out data/results/nvidia-h200/engine"
REQUIRED = ["step", "kind", "batch", "new_tokens", "context", "decodes", "decode_context", "class", "status"]
MEASURED = ["kernels", "busy_ms", "floor_ms", "step_ms", "profiled_wall_ms", "idle_gap_ms", "graph_idle_ms"]
MEASURED += ["host_ms", "step_floor_ms"]


@dataclass(frozen=True)
class BudgetPage:
    """What ``prepare`` writes for the step budget: the include's markdown, and the figure (None: no figure)."""

    markdown: str
    svg: str | None = None


def find_step_budget(root: Path | None = None, device: str = BOOK_DEVICE) -> Path | None:
    """The step budget's CSV on the book's device (the last slug in name order if several), None if none."""
    found = sorted(Path(root or results_root()).glob(f"*{device}*/engine/{CSV}"))
    return found[-1] if found else None


def step_label(r) -> str:
    """A step kind in words, from its row's shape columns."""
    if r.kind == "decode":
        return f"decode, batch {r.batch}, context {r.context:,}"
    if r.kind == "mixed":
        chunk = f"a {r.new_tokens:,}-token chunk" + (f" after {r.context:,}" if r.context else "")
        return f"mixed: {r.decodes} decodes at context {r.decode_context:,} + {chunk}"
    after = f" after {r.context:,} cached" if r.context else ""
    return f"prefill of {r.new_tokens:,} tokens" + (f" × {r.batch}" if r.batch > 1 else "") + after


def sidecar(csv: Path) -> dict:
    path = csv.parent / SIDECAR
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}


def _source(csv: Path, side: dict) -> str:
    """'From `<slug>/engine/step_budget.csv`, run at commit X on DATE (model, dtype)'."""
    text = f"From `{md_text(csv.parent.parent.name)}/engine/{CSV}`"
    if side:
        commit = str(side.get("git_commit") or "unknown")[:12]
        when = side.get("written_utc") or side.get("started_utc") or "an unrecorded time"
        text += f", run at commit `{md_text(commit)}` on {md_text(when)}"
        params = side.get("params") or {}
        if params.get("model"):
            text += f" ({md_text(params['model'])}, {md_text(params.get('dtype', ''))})"
    return text


def ms_text(v: float) -> str:
    """A time in ms to three significant figures (a sampling floor is a few ns), "—" where there is none."""
    return "—" if pd.isna(v) else format_value(str(v))


def budget_table(ok: pd.DataFrame, labels: dict[str, str]) -> str:
    """One column per step kind (the page is narrower than five kinds are many): its times, each class's busy time
    and floor, its idle gaps and host time, the sum of its floors."""
    columns = {}
    for step, label in labels.items():
        s = ok[ok.step == step].set_index("class")
        first = s.iloc[0]
        col = {
            "step time, CUDA events (ms)": ms_text(first.step_ms),
            "profiled, synchronised call (ms)": ms_text(first.profiled_wall_ms),
            "kernels per step": f"{s.kernels.sum():.0f}",
        }
        for c in CLASSES:
            col[f"{LABELS[c]}: busy / floor (ms)"] = f"{ms_text(s.at[c, 'busy_ms'])} / {ms_text(s.at[c, 'floor_ms'])}"
        col |= {
            "GPU idle inside the graph (ms)": ms_text(first.graph_idle_ms),
            "GPU idle, all (ms)": ms_text(first.idle_gap_ms),
            "host, no kernel running (ms)": ms_text(first.host_ms),
            "floor: sum of the classes' (ms)": ms_text(first.step_floor_ms),
        }
        columns[label] = col
    return frame_table(pd.DataFrame(columns).rename_axis("per step kind").reset_index(), "servelab-engine-step-budget")


def kernel_name(name: str) -> str:
    """A kernel's name without the C++ around it: ``void at::native::reduce_kernel<512, 1, …>(…)`` reads
    ``at::native::reduce_kernel``; Triton's and cuBLAS's names are short already."""
    name = name.removeprefix("void ").strip()
    for cut in ("<", "("):
        name = name.split(cut, 1)[0]
    return name.strip() or "(unnamed)"


def kernels_table(kernels: pd.DataFrame, labels: dict[str, str], top: int = TOP_KERNELS) -> str:
    """The ``top`` busiest kernels of each step kind: class, name, launches and busy µs per step, and share of the
    step's kernel time ("" where the CSV holds none of the steps)."""
    header = ["step kind", "kernel", "class", "launches per step", "busy per step (µs)", "share of kernel time"]
    rows = []
    for step, label in labels.items():
        k = kernels[kernels.step == step].sort_values("busy_ms", ascending=False, kind="stable")
        total = k.busy_ms.sum()
        for r in k.head(top).to_dict("records"):
            rows.append(
                [
                    md_text(label),
                    f"`{kernel_name(str(r['kernel'])).replace('`', '')}`",
                    md_text(LABELS.get(r["class"], str(r["class"]))),
                    f"{r['launches']:.0f}",
                    f"{r['busy_ms'] * 1e3:.1f}",
                    f"{r['busy_ms'] / total:.0%}" if total > 0 else "—",
                ]
            )
    if not rows:
        return ""
    return (
        f"The {top} busiest kernels of each step kind, from `{KERNELS_CSV}` beside it (each kernel's launches and "
        "time per step, averaged over the profiled calls):\n\n"
        + list_table(header, rows, css="servelab-engine-step-kernels")
    )


def figure_block(ok: pd.DataFrame, labels: dict[str, str]) -> str:
    """The figure directive, with a caption that says what each bar holds and how busy the kernels kept the GPU."""
    steps = ok.groupby("step", sort=False).first()
    busy = ok.groupby("step", sort=False).busy_ms.sum() / steps.profiled_wall_ms
    shares = "; ".join(f"{labels[s]}: {busy[s]:.0%}" for s in labels)
    caption = (
        "Per step kind, the top bar is one profiled, synchronised call of the engine's step (its forward, sampling "
        "and the copy of its tokens to the host): each class's kernel time, the GPU's idle gaps inside the captured "
        "graph and outside it, and the host's time with no kernel running. The bottom bar is each class's floor at "
        "the ceilings measured in the same run. Each panel has its own scale. Share of the call the kernels kept "
        f"the GPU busy: {shares}."
    )
    return (
        f"```{{figure}} _generated/{FIGURE}\n:name: fig-engine-step-budget\n"
        f":alt: stacked bars of kernel time by class, idle gaps and host time beside each class's floor\n\n"
        f"{md_text(caption)}\n```\n"
    )


def step_budget_page(csv: Path | None) -> BudgetPage:
    """The include (and figure) of the step budget in ``csv``, or the sentence saying it has not been measured."""
    if csv is None:
        return BudgetPage(
            f"The step budget has not been measured on the H200 yet: `{COMMAND}` on the H200 measures it "
            "(`make gpu-plan` lists it as `engine:step_budget:0`).\n"
        )
    budget = pd.read_csv(csv)
    ok = budget[budget.status == "ok"] if "status" in budget.columns else budget
    # a run in which no step kind was measured has no measured columns
    missing = [c for c in REQUIRED + (MEASURED if len(ok) else []) if c not in budget.columns]
    if missing:
        raise ValueError(f"{csv}: missing columns {missing}")
    failed = budget[budget.status != "ok"].groupby("step", sort=False).status.first()
    not_run = "".join(f"\n\nNot measured: {md_text(step)} ({md_text(why)})." for step, why in failed.items())
    side = sidecar(csv)
    if ok.empty:
        return BudgetPage(f"{_source(csv, side)}: no step kind was measured.{not_run}\n")
    labels = {r.step: step_label(r) for r in ok.groupby("step", sort=False).first().reset_index().itertuples()}
    device_name = (side.get("device") or {}).get("name", "the H200")
    fresh = freshness("step_budget", side, "The step budget")
    text = f"{_source(csv, side)}:\n\n" + (fresh + "\n" if fresh else "")
    text += figure_block(ok, labels) + "\n" + budget_table(ok, labels) + not_run
    kernels_csv = csv.parent / KERNELS_CSV
    if kernels_csv.exists():
        text += "\n\n" + kernels_table(pd.read_csv(kernels_csv), labels)
    return BudgetPage(text.rstrip("\n") + "\n", figure_svg(ok, labels, device_name))
