"""How to re-run each study: the papermill command and the notebook's parameters, read from the notebook.

The parameters shown are the source of the cell tagged ``parameters`` in ``notebooks/NN_name.ipynb``,
so the methodology page cannot drift from the notebooks. The command and the cell's source come from
``servelab.studies.common.rerun``, which the study pages' own re-run sections use too.
"""

from __future__ import annotations

from pathlib import Path

from servelab.studies.common import rerun
from servelab.studies.common.markdown import md_text
from servelab.studies.common.rerun import parameters_source
from servelab_book.studies import NOTEBOOKS_DIR, STUDIES, Study, page_title, study_by_slug

__all__ = ["papermill_command", "parameters_source", "render_reproduce", "rerun_markdown"]  # parameters_source: rerun's


def papermill_command(study: Study, profile: str = "full") -> str:
    """The one-line command that re-executes a study into the book (run from the repository root)."""
    return rerun.papermill_command(study.slug, profile=profile)


def render_reproduce(notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """One section per study: its papermill command and parameters, or a note that it has no notebook yet."""
    out = []
    for s in STUDIES:
        nb = notebooks_dir / f"{s.slug}.ipynb"
        title = (page_title(nb) if nb.exists() else None) or f"Study {s.number}: {s.title}"
        out.append(f"### {md_text(title)}\n")
        if not nb.exists():
            out.append(f"Its notebook, `notebooks/{s.slug}.ipynb`, is not written yet.\n")
            continue
        out.append(f"```bash\n{papermill_command(s)}\n# or: make reproduce STUDIES={s.slug} PROFILE=full\n```\n")
        out.append("Parameters, from the notebook's `parameters` cell (pass any with `-p name value`):\n")
        out.append(f"```python\n{parameters_source(nb)}\n```\n")
    return "\n".join(out)


def rerun_markdown(slug: str, notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """A study page's re-run section: the papermill command and the notebook's parameters cell, as markdown.

    The page shows its parameters here, visible, while its own parameters cell stays out of sight at the top.
    """
    study = study_by_slug(slug)
    source = parameters_source(notebooks_dir / f"{slug}.ipynb")
    return (
        f"```bash\n{papermill_command(study)}\n# or: make reproduce STUDIES={slug} PROFILE=full\n```\n\n"
        "Parameters, from the notebook's `parameters` cell (pass any with `-p name value`; `None` is the profile's "
        f"default):\n\n```python\n{source}\n```\n"
    )
