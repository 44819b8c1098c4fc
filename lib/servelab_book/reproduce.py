"""How to reproduce the book: the GPU plan, the GPU runs, the replay, and each notebook's parameters.

The methodology page's section. Each study's part is the study page's own re-run section
(``servelab.studies.common.rerun.rerun_section``), whose parameters are the source of the cell tagged ``parameters``
in ``notebooks/NN_name.ipynb``, so the page cannot drift from the notebooks or from the study pages.
"""

from __future__ import annotations

from pathlib import Path

from servelab.studies.common import rerun
from servelab.studies.common.markdown import md_text
from servelab.studies.common.rerun import parameters_source
from servelab_book.studies import NOTEBOOKS_DIR, STUDIES, Study, page_title

__all__ = ["papermill_command", "parameters_source", "render_reproduce"]  # parameters_source: rerun's

WORKFLOW = """Measuring and reporting are apart. A GPU run only **measures**: each study's measuring path
(`lib/servelab/studies/s<NN_name>/measure.py`) writes raw tidy CSVs and a `run.json` to
`data/results/<device>/<study>/runs/<fingerprint>/<part>/r<repeat>/`. The fingerprint is a hash of the source files the
measuring path imports (its import closure), so a change to reporting code (verdicts, figures, page text) never
makes data stale. Every book build **reports**: each page is rendered from the committed runs by the study's
reporting path (`report.py`), with today's rules, on a CPU.

```bash
make gpu-plan                                  # the GPU jobs missing at today's fingerprints, with minutes,
                                               # packed into GPU runs of at most 9 minutes
scripts/gpu_run.sh 02_gpu_costs:all:0 02_gpu_costs:all:1   # on the GPU machine: jobs STUDY:PART:REPEAT
make book                                      # render every page from data/results (replay), prepare, build
```

One study page by hand, from the committed runs (measures nothing), or measuring first on a CUDA device:

```bash
.venv/bin/papermill --cwd notebooks notebooks/02_gpu_costs.ipynb book/studies/02_gpu_costs.ipynb -p profile replay
.venv/bin/papermill --cwd notebooks notebooks/02_gpu_costs.ipynb /tmp/02_gpu_costs.ipynb -p profile full
```
"""


def papermill_command(study: Study, profile: str = "full") -> str:
    """The one-line command that runs a study's notebook in ``profile`` (run from the repository root)."""
    return rerun.papermill_command(study.slug, profile=profile)


def render_reproduce(notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """The workflow, then one section per study: its page's own re-run section (``rerun.rerun_section``: the replay
    into the book's page, its real GPU jobs, a full run into a notebook of its own, and its parameters), so the
    methodology page cannot give a command that the study page does not, nor overwrite a committed page with a GPU
    run."""
    out = [WORKFLOW]
    for s in STUDIES:
        nb = notebooks_dir / f"{s.slug}.ipynb"
        title = (page_title(nb) if nb.exists() else None) or f"Study {s.number}: {s.title}"
        out.append(f"### {md_text(title)}\n")
        if not nb.exists():
            out.append(f"Its notebook, `notebooks/{s.slug}.ipynb`, is not written yet.\n")
            continue
        out.append(rerun.rerun_section(s.slug, notebooks_dir))
    return "\n".join(out)
