"""F2.3's verdict from the simulator's validation: do measured GPU costs make a faithful serving simulator?

The seed (RTX 2070) said "the simulator's default costs hold for server-level amortized batching". Here the
test is the median |error| of the simulated serving metrics on held-out runs of the real server, for the models
whose GPU costs Study 2 measured:

- ``holds``: Study 2's GPU costs alone already give a median |error| within the goal (10 %);
- ``changes``: they do not, but with the serving overheads fitted from the step log the simulator is within
  the goal: GPU costs hold only once the CPU-side cost per step is added;
- ``fails``: not even then.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.common.findings import Finding
from servelab.studies.common.tested_on import model_name, models_tested_on
from servelab.studies.s08_simulator.plots import GOAL_PCT

F23_CLAIM = "the simulator's default costs hold for server-level amortized batching"


def median_abs_error(table: pd.DataFrame, cost_model: str, subset: str = "validation") -> float:
    """Median |error_pct| over the runs of ``subset`` (all runs if that subset is empty) and every metric."""
    t = table[(table["cost_model"] == cost_model)].dropna(subset=["error_pct"])
    v = t[t["subset"] == subset]
    v = v if len(v) else t
    return float(np.median(np.abs(v["error_pct"]))) if len(v) else float("nan")


def f23_finding(table: pd.DataFrame, source: str) -> Finding | None:
    """F2.3's finding from the validation table; None without data."""
    if "gpu_source" in table.columns:  # F2.3 is about Study 2's measured costs, not a fit to the server's log
        table = table[table["gpu_source"] == "Study 2"]
    if table.empty:
        return None
    before = median_abs_error(table, "gpu_only")
    after = median_abs_error(table, "gpu+overheads")
    if not (np.isfinite(before) and np.isfinite(after)):
        return None
    if before <= GOAL_PCT:
        verdict = "holds"
    elif after <= GOAL_PCT:
        verdict = "changes"
    else:
        verdict = "fails"
    models = sorted(table["model"].unique()) if "model" in table.columns else []
    note = (
        f"median |error| of p50/p99 TTFT, p50/p99 ITL, max stall and throughput over held-out real runs: "
        f"{before:.1f} % with the GPU costs alone, {after:.1f} % with the fitted serving overheads "
        f"(goal {GOAL_PCT:g} %); only the runs of the models Study 2 costed "
        f"({', '.join(map(model_name, models)) if models else 'all'}); real runs: {source}"
    )
    return Finding(
        id="F2.3",
        claim=F23_CLAIM,
        seed_value="holds (RTX 2070, no error reported)",
        # as many figures as the interval over repeats beside it (``repeats._fmt``): their median then reads as the
        # headline's, where a value to one decimal gave a median of rounded numbers (27.25 beside a headline 27.26)
        measured_value=f"{after:.4g}",
        unit="% median |error|",
        verdict=verdict,
        note=note,
        tested_on=f"{models_tested_on(models) if models else 'the replayed models'}, simulated against {source}",
        headline=after,
        headline_unit=f"% median |error| with the fitted serving overheads (goal {GOAL_PCT:g}%; the GPU costs alone "
        "in the note)",
    )
