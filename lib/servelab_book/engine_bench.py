"""The engine page's benchmark table, from ``data/results/<h200 slug>/engine/bench.csv``.

The engine's benchmark writes rows ``metric, value, unit`` (and optional further columns such as a
floor or a note); this renders them as they are, with values formatted for reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root
from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab_book.findings import BOOK_DEVICE

REQUIRED = ["metric", "value", "unit"]


def find_bench(root: Path | None = None, device: str = BOOK_DEVICE) -> Path | None:
    """The engine's bench.csv on the book's device (the last slug in name order if several)."""
    found = sorted(Path(root or results_root()).glob(f"*{device}*/engine/bench.csv"))
    return found[-1] if found else None


def render_engine_bench(path: Path | None) -> str:
    """A MyST table of the benchmark, or a sentence saying it has not run on the H200 yet."""
    if path is None:
        return "The engine has not been benchmarked on the H200 yet.\n"
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; expected at least {REQUIRED}")
    cols = REQUIRED + [c for c in df.columns if c not in REQUIRED]
    rows = [[md_text(format_value(r[c]) if c != "metric" else r[c]) or "—" for c in cols] for _, r in df.iterrows()]
    table = list_table([md_text(c) for c in cols], rows, css="servelab-engine-bench")
    return f"From `{md_text(path.parent.parent.name)}`{_provenance(path)}:\n\n" + table


@dataclass(frozen=True)
class BenchProvenance:
    """Where the benchmark's numbers come from, as its ``run.json`` sidecar records it."""

    commit: str  # the measured tree's commit, first 12 hex digits ("" if unrecorded)
    when: str  # written_utc (else started_utc) of the run, "" if unrecorded
    fingerprint: str = ""  # its measuring path's (servelab.bench.jobs.stamp); "" for runs before it was recorded
    fingerprint_files: dict | None = None
    params: dict | None = None  # the run's parameters (its model, the MFU rows' model, ...)


def bench_provenance(bench_csv: Path | None) -> BenchProvenance | None:
    """The provenance of ``bench.csv`` from the ``run.json`` beside it; None if there is none or it is not JSON.

    The one reader of the benchmark's sidecar for the book (this table's caption and the engine page's
    code-status line)."""
    side = None if bench_csv is None else bench_csv.parent / "run.json"
    if side is None or not side.exists():
        return None
    try:
        run = json.loads(side.read_text())
    except ValueError:
        return None
    return BenchProvenance(
        commit=str(run.get("git_commit") or "")[:12],
        when=str(run.get("written_utc") or run.get("started_utc") or ""),
        fingerprint=str(run.get("fingerprint") or ""),
        fingerprint_files=run.get("fingerprint_files") if isinstance(run.get("fingerprint_files"), dict) else None,
        params=run.get("params") if isinstance(run.get("params"), dict) else None,
    )


def _provenance(path: Path) -> str:
    """', run at commit X on DATE' from the run's sidecar, so a reader can tell which engine code was measured."""
    prov = bench_provenance(path)
    if prov is None:
        return ""
    return f", run at commit `{md_text(prov.commit or 'unknown')}` on {md_text(prov.when or 'an unrecorded time')}"
