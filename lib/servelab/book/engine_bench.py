"""The engine page's benchmark table, from ``data/results/<h200 slug>/engine/bench.csv``.

The engine's benchmark writes rows ``metric, value, unit`` (and optional further columns such as a
floor or a note); this renders them as they are, with values formatted for reading.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.book.findings import BOOK_DEVICE
from servelab.book.findings_table import format_value, list_table, md_text
from servelab.results import results_root

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


def _provenance(path: Path) -> str:
    """', run at commit X on DATE' from the run's sidecar, so a reader can tell which engine code was measured."""
    import json

    side = path.parent / "run.json"
    if not side.exists():
        return ""
    try:
        run = json.loads(side.read_text())
    except ValueError:
        return ""
    commit = str(run.get("git_commit", "unknown"))[:12]
    when = run.get("written_utc") or run.get("started_utc") or "an unrecorded time"
    return f", run at commit `{md_text(commit)}` on {md_text(str(when))}"
