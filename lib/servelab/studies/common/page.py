"""The findings-first parts every study page shares, generated from a run: the verdict table, the takeaways,
the figures shown in place, and the re-run recipe.

A study's ``page`` module computes its run and calls these, so that each section of a notebook is one library
call and no number on the page is typed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

import pandas as pd

from servelab.studies.common.findings import Finding

SEED_GPU = "RTX 2070"

# tqdm.auto, which huggingface_hub imports when a model loads, warns "IProgress not found" where ipywidgets is not
# installed. The pages run every sweep with its progress bar off, so the warning says nothing to a reader.
warnings.filterwarnings("ignore", message="IProgress not found")


def verdict_table(findings: Iterable[Finding]) -> pd.DataFrame:
    """One row per claim: the seed's value, this run's value with its unit, the verdict and what it was tested on."""
    rows = [
        {
            "claim": f"{f.id}: {f.claim}",
            f"seed ({SEED_GPU})": f.seed_value,
            "this run": f"{f.measured_value} ({f.unit})" if f.unit else f.measured_value,
            "verdict": f.verdict,
            "tested on": f.tested_on,
        }
        for f in findings
    ]
    cols = ["claim", f"seed ({SEED_GPU})", "this run", "verdict", "tested on"]
    return pd.DataFrame(rows, columns=cols)


def bullets(sentences: Iterable[str]) -> str:
    """Markdown bullets, one per non-empty sentence."""
    return "\n".join(f"- {s.strip()}" for s in sentences if s and s.strip()) + "\n"


def finding_notes(findings: Iterable[Finding]) -> str:
    """Markdown: each claim's verdict with the rule's reasoning (the note), for the findings' details section."""
    return "\n".join(
        f"- **{f.id} {f.verdict}.** {f.claim}. {SEED_GPU}: {f.seed_value}; this run: {f.measured_value} "
        f"({f.unit}). {f.note}."
        for f in findings
    )


def show(*items) -> None:
    """Display tables, markdown strings and figures in order; a figure is closed once shown (no second copy)."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    for item in items:
        if item is None:
            continue
        if isinstance(item, str):
            display(Markdown(item))
        elif hasattr(item, "savefig"):
            display(item)
            plt.close(item)
        else:
            display(item)


def rerun_recipe(slug: str, params: Mapping, *, out: str | None = None, extra: Iterable[str] = ()) -> str:
    """Markdown: the papermill command that re-runs a study, the notebook's ``parameters`` cell as written (read
    from ``notebooks/<slug>.ipynb``), and the values this run resolved them to."""
    from servelab.paths import REPO_ROOT
    from servelab_book.reproduce import parameters_source

    out = out or f"book/studies/{slug}.ipynb"
    cmd = f"papermill notebooks/{slug}.ipynb {out} --cwd notebooks -p profile full"
    lines = [f"```bash\n{cmd}\n" + "".join(f"{e}\n" for e in extra) + "```\n"]
    nb = REPO_ROOT / "notebooks" / f"{slug}.ipynb"
    if nb.exists():
        lines.append("The notebook's parameters (pass any with `-p name value`; `None` is the profile's default):\n")
        lines.append(f"```python\n{parameters_source(nb)}\n```\n")
    resolved = ", ".join(f"`{k}={v!r}`" for k, v in params.items())
    lines.append(f"This run resolved them to: {resolved}.\n")
    return "\n".join(lines)
