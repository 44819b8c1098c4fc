"""The α that real trained drafts reach, read from Study 6's run on the same device, for Study 3's curves.

Study 6 measures α on the real target (SmolLM2-135M-Instruct) with its distilled drafts, self-drafts and prompt
lookup (``s03_speculative.real_acceptance``), and writes ``06_hf_assisted/real_alpha.csv``. Study 3's controlled
curves are read at those α: where a draft of that quality would land at the seed's shapes. The two runs are
separate notebooks, so the one-commit book runs Study 6 before Study 3; until it has, there is nothing to draw and
the page says so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.studies.s03_speculative.plots import REAL_ALPHA_COLUMNS

STUDY6 = "06_hf_assisted"
FILE = "real_alpha.csv"


def measured_alpha(device_dir: Path) -> pd.DataFrame | None:
    """Study 6's α per pair on the device whose results live in ``device_dir`` (``StudyResults.device_dir``), or
    None where Study 6 has not written them there."""
    path = Path(device_dir) / STUDY6 / FILE
    if not path.is_file():
        return None
    table = pd.read_csv(path)
    missing = set(REAL_ALPHA_COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"{path} lacks the columns {sorted(missing)} that the curves need")
    return table


def measured_alpha_note(real_alpha: pd.DataFrame | None, device_name: str) -> str:
    """The line under the curves: which measured α they show, or that none was measured on this device yet."""
    if real_alpha is None or real_alpha.empty:
        return (
            f"*No α from trained drafts on the {device_name} yet: Study 6 writes them ({STUDY6}/{FILE}) and runs "
            "before this page in a whole-book run.*"
        )
    parts = "; ".join(f"{r.pair} {r.alpha:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in real_alpha.itertuples())
    return f"*Grey bands: α measured by Study 6 on the {device_name} (95% bootstrap interval): {parts}.*"
