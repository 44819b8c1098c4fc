"""Against published results: the field's numbers (``data/published/published.csv``) beside this book's.

Each published number carries its unit, the hardware it was measured on and its bibliography key
(``book/references.bib``). Its counterpart here is computed by the study's reporting path from its runs, never typed:
each study's ``report.published_value(runs)`` returns the value and a few words saying what it is (None where
nothing was measured), and ``published_section`` writes the MyST table its page shows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.paths import DATA_DIR
from servelab.studies.common.markdown import list_table, md_text

PUBLISHED_CSV = DATA_DIR / "published" / "published.csv"
COLUMNS = ["study", "metric", "value", "unit", "hardware", "source", "note"]
TABLE_COLUMNS = ["metric", "published", "hardware", "source", "ours", "ours_what", "note"]
NOT_MEASURED = "not measured"


def load_published(path: Path = PUBLISHED_CSV) -> pd.DataFrame:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    return df


def published_table(study: str, ours: tuple[str, str] | None, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """The published numbers of ``study`` beside ``ours`` (value, what it is; None: not measured)."""
    pub = load_published() if published is None else published
    value, what = ours if ours is not None else (NOT_MEASURED, "no run of this study on the book's device")
    rows = [
        {
            "metric": r.metric,
            "published": f"{r.value} {r.unit}",
            "hardware": r.hardware,
            "source": r.source,
            "ours": value,
            "ours_what": what,
            "note": r.note,
        }
        for r in pub[pub["study"] == study].itertuples()
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def published_section(study: str, ours: tuple[str, str] | None, device: str = "H200") -> str:
    """A MyST table of ``published_table``, citing each source; ``device`` heads this book's column."""
    t = published_table(study, ours)
    if t.empty:
        return "No published number is paired with this study yet.\n"
    header = ["Metric", "Published", "Measured on", "Source", f"{md_text(device)} (this book)", "Note"]
    rows = [
        [
            md_text(r.metric),
            md_text(r.published),
            md_text(r.hardware),
            f"{{cite:p}}`{r.source}`",
            md_text(f"{r.ours} ({r.ours_what})"),
            md_text(r.note),
        ]
        for r in t.itertuples()
    ]
    return list_table(header, rows, [18, 10, 18, 10, 24, 20], css="servelab-published")
