"""Study 1's step costs by kind (``servelab.studies.s01_scheduling.step_costs``) as a table for its page.

Rendered at book-build time from the committed step log of the H200 run, so the page can show the
evidence for what its verdicts rest on without re-running the study.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root
from servelab.studies.s01_scheduling.step_costs import step_costs
from servelab_book.engine_tables import frame_table
from servelab_book.findings import BOOK_DEVICE


def find_steps(root: Path | None = None, device: str = BOOK_DEVICE) -> Path | None:
    found = sorted(Path(root or results_root()).glob(f"*{device}*/01_scheduling/steps.csv"))
    return found[-1] if found else None


def render_step_costs(path: Path | None) -> str:
    if path is None:
        return "Study 1 has no step log from the H200 yet.\n"
    t = step_costs(pd.read_csv(path), by=("model", "scheduler"))
    shown = pd.DataFrame(
        {
            "model": t["model"],
            "policy": t["scheduler"],
            "step kind": t["kind"].astype(str),
            "steps": t["steps"],
            "median tokens": t["median_tokens"].map(lambda v: f"{v:,.0f}"),
            "median ms": t["median_ms"].map(lambda v: f"{v:.2f}"),
            "p90 ms": t["p90_ms"].map(lambda v: f"{v:.2f}"),
            "× decode-only step": t["x_decode_step"].map(lambda v: f"{v:.1f}"),
        }
    )
    return f"From `{path.parent.parent.name}/01_scheduling/steps.csv`:\n\n" + frame_table(shown, "servelab-step-costs")
