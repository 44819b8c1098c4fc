"""The α that real trained drafts reach, read from Study 6's runs on the book's device, for Study 3's curves.

Study 6 measures α on the real target (SmolLM2-135M-Instruct) with its distilled drafts, self-drafts and prompt
lookup (``s03_speculative.real_acceptance``): older runs wrote ``real_alpha.csv``, today's keep the per-prompt
agreement, from which its report computes the same table (``s06_hf_assisted.alpha.real_alpha``). Study 3's controlled
curves are read at those α: where a draft of that quality would land at the seed's shapes. Read at render time
through ``study_runs("06_hf_assisted")``; where Study 6's runs hold no such table, the page says "not measured".
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.studies.common.runs import study_runs
from servelab.studies.s03_speculative.plots import REAL_ALPHA_COLUMNS

STUDY6 = "06_hf_assisted"
FILE = "real_alpha"


def study6_alpha(root: Path | None = None) -> pd.DataFrame | None:
    """Study 6's α per pair (its first repeat that measured them), or None where its runs hold no ``real_alpha``
    table with the columns the curves need (or Study 6 cannot be read at all)."""
    try:
        runs = study_runs(STUDY6, root)
    except Exception:  # noqa: BLE001 — another study's state never breaks this page
        return None
    for rep in runs.per_repeat():
        table = rep.table(FILE)
        if not table.empty and not set(REAL_ALPHA_COLUMNS) - set(table.columns):
            return table[[c for c in table.columns if c not in ("part", "repeat")]]
    # Study 6's runs since its move to SmolLM2 keep the per-prompt agreement (alpha_hits.csv) and compute α with its
    # interval in their report, as its own page shows it: read it the same way, so the two pages agree
    from servelab.studies.s06_hf_assisted.alpha import real_alpha

    table = real_alpha(runs)
    return None if table.empty or set(REAL_ALPHA_COLUMNS) - set(table.columns) else table


def measured_alpha_note(real_alpha: pd.DataFrame | None, device_name: str) -> str:
    """The line under the curves: which measured α they show, or that none was measured on this device yet."""
    if real_alpha is None or real_alpha.empty:
        return f"*Study 6's α of trained drafts: not measured on the {device_name} (no α in its runs).*"
    parts = "; ".join(f"{r.pair} {r.alpha:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in real_alpha.itertuples())
    return f"*Grey bands: α measured by Study 6 on the {device_name} (95% bootstrap interval): {parts}.*"
