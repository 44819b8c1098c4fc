"""The methodology page's hardware table: the device, versions and ceilings of each study's H200 run.

The ceilings (copy bandwidth, matmul rate) are the ones each study measured in its own run; they are
read from the ``run.json`` sidecars, never typed.
"""

from __future__ import annotations

import pandas as pd

from servelab_book.findings_table import format_utc, format_value, md_text
from servelab_book.studies import study_by_slug


def render_runs_table(runs: pd.DataFrame) -> str:
    """A MyST table of the runs (see ``findings.book_runs``), or a sentence saying there are none yet."""
    if runs.empty:
        return (
            "No study has been run on the H200 yet, so no ceilings are recorded here: each study page "
            "prints the ceilings it measured in its own run once it is executed.\n"
        )
    header = ["Study", "Device", "Run started", "torch / CUDA / driver", "Copy (GB/s)", "Matmul (TFLOP/s)"]
    lines = [":::{list-table}", ":header-rows: 1", ":class: servelab-runs", "", "* - " + "\n  - ".join(header)]
    for r in runs.itertuples():
        study = study_by_slug(r.study)
        cells = [
            f"{{doc}}`Study {study.number} </{study.docname}>`",
            md_text(r.device_name or "?"),
            md_text(format_utc(r.started_utc) if r.started_utc else "?"),
            md_text(f"{r.torch} / {r.cuda} / {r.driver}"),
            _num(r.copy_gb_s),
            _num(r.matmul_tflop_s) + (f" ({md_text(r.matmul_dtype)})" if r.matmul_dtype else ""),
        ]
        lines.append("* - " + "\n  - ".join(cells))
    lines.append(":::")
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "?" if x is None or pd.isna(x) else md_text(format_value(str(x)))
