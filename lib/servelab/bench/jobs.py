"""The engine page's GPU jobs: the benchmark (``bench.csv`` and its tables) and the step budget
(``step_budget.csv``), each listed by ``make gpu-plan`` while the book's device has no complete run of it at its
measuring path's fingerprint today.

A study's runs live under ``runs/<fingerprint>/<part>/r<k>/``; the engine's are one flat folder,
``<results>/<device>/engine/``, rewritten by each run, with a sidecar per job (``run.json``, ``step_budget.run.json``)
that records the fingerprint of the module that measured it (``servelab.bench.run``, ``servelab.bench.step_budget``:
the engine, its kernels, KV cache and models are in both closures). A sidecar with no fingerprint (the benchmark's
runs before 2026-12-04) is stale by definition: nothing says what code measured it.

One run each, not three: the engine page states no seed claim; each row is already a median over repeated calls
inside its run, and issue 29's goals are checked on the latest run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.measure.fingerprint import fingerprint

STUDY = "engine"  # the job's study name in the plan (``engine:bench:0``) and the results folder's
BOOK_DEVICE = "h200"  # as the studies' pages (``studies.common.runs.BOOK_DEVICE``): the book's device folders


@dataclass(frozen=True)
class BenchJob:
    part: str
    module: str  # the measuring module whose fingerprint stales the data
    args: tuple[str, ...]  # after ``python -m <module>``
    sidecar: str  # its record under <results>/<device>/engine/
    guess_min: float  # before any run recorded its time

    def command(self) -> list[str]:
        main = self.module.removesuffix(".run")  # the benchmark's door is the package (``python -m servelab.bench``)
        return [sys.executable, "-m", main, *self.args]


JOBS = {
    # time budgets below the call's: a late section or step kind is skipped and recorded, not cut off mid-table
    "bench": BenchJob("bench", "servelab.bench.run", ("--time-budget", "360"), "run.json", 4.0),
    "step_budget": BenchJob(
        "step_budget",
        "servelab.bench.step_budget",
        ("--model", "config:qwen2-0.5b", "--time-budget", "270"),
        "step_budget.run.json",
        5.0,
    ),
}


def sidecars(job: BenchJob, root: Path) -> list[dict]:
    """The job's records on the book's device(s) under ``root`` (the results root)."""
    out = []
    for path in sorted(Path(root).glob(f"*{BOOK_DEVICE}*/{STUDY}/{job.sidecar}")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def is_current(meta: dict, today: str) -> bool:
    return bool(meta.get("complete")) and meta.get("fingerprint") == today


def recorded_minutes(meta: dict) -> float | None:
    s = meta.get("duration_s") or meta.get("wall_s")
    return float(s) / 60 if s else None


def missing(root: Path, start_min: float) -> list[tuple[str, float, str]]:
    """(part, expected minutes, basis) for each engine job with no complete run at today's fingerprint."""
    todo = []
    for job in JOBS.values():
        metas = sidecars(job, root)
        today = fingerprint(job.module).digest
        if any(is_current(m, today) for m in metas):
            continue
        times = [t for t in map(recorded_minutes, metas) if t]
        if times:
            todo.append((job.part, max(times[-1], 1.0) + start_min, "recorded (older code)"))
        else:
            todo.append((job.part, job.guess_min + start_min, "guess"))
    return todo


def stamp(module: str) -> dict:
    """What a job's sidecar records of its measuring path (the studies' ``run.json`` keys)."""
    fp = fingerprint(module)
    return {"fingerprint": fp.digest, "measuring_module": fp.module, "fingerprint_files": fp.files}
