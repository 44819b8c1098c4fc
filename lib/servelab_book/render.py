"""``python -m servelab_book render``: every study page and the simulator page rendered from the committed data.

Each source notebook (``notebooks/NN_*.ipynb``) runs under papermill with ``profile="replay"``: it measures nothing,
reads ``data/results/<device>/<study>/runs/`` through its study's reporting path and shows today's layout over that
data. The rendered notebook is the page the book keeps (``book/studies/NN_*.ipynb``, ``book/simulator.ipynb``).

A render carries nothing that changes between two renders of the same data: papermill's timings and environment
are dropped, and figures are SVG with fixed ids (``studies.common.style``). So a second render gives the same bytes,
and CI's nbval re-render of the committed pages fails on any difference from their data or their source.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from servelab.errors import ParameterError
from servelab.paths import REPO_ROOT
from servelab.studies.common.rerun import page_path
from servelab_book.studies import STUDIES

REPLAY = {"profile": "replay"}


@dataclass(frozen=True)
class PageSource:
    notebook: str  # notebooks/02_gpu_costs.ipynb
    page: str  # book/studies/02_gpu_costs.ipynb


PAGE_SOURCES: tuple[PageSource, ...] = tuple(
    PageSource(f"notebooks/{slug}.ipynb", page_path(slug)) for slug in (*(s.slug for s in STUDIES), "08_simulator")
)


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what differs between two renders of the same data: papermill's per-cell and per-notebook timings,
    its environment, and the kernel's execution timestamps. The injected parameters stay (nbval replays them)."""
    pm = nb.metadata.get("papermill", {})
    nb.metadata["papermill"] = {"parameters": pm.get("parameters", {})}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"  # papermill gives its injected cell a random id
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            for out in cell.get("outputs", []):
                out.get("metadata", {}).pop("execution", None)
    return nb


def render_page(src: PageSource, root: Path = REPO_ROOT) -> float:
    """Render one page with papermill (profile "replay"); its seconds. Raises papermill's error on a failed cell.
    The data are ``$SERVELAB_RESULTS`` where set, else ``data/results``."""
    import papermill

    t0 = time.monotonic()
    dest = root / src.page
    papermill.execute_notebook(
        str(root / src.notebook),
        str(dest),
        parameters=REPLAY,
        cwd=str(root / "notebooks"),
        progress_bar=False,
        log_output=False,
        kernel_name="python3",
    )
    nbformat.write(clean(nbformat.read(dest, as_version=4)), dest)
    return time.monotonic() - t0


def render_all(root: Path = REPO_ROOT, only: list[str] | None = None, jobs: int | None = None) -> dict[str, float]:
    """Render every page (or those whose notebook stem is in ``only``), ``jobs`` kernels at a time; seconds each.
    A stem that names no page is refused before anything renders (``render simulator`` rendered nothing, silently:
    the simulator page's notebook is ``08_simulator``)."""
    stems = [Path(s.notebook).stem for s in PAGE_SOURCES]
    unknown = sorted(set(only or ()) - set(stems))
    if unknown:
        raise ParameterError(f"no page's notebook is named {', '.join(unknown)}; the stems: {', '.join(stems)}")
    sources = [s for s in PAGE_SOURCES if not only or Path(s.notebook).stem in only]
    jobs = jobs or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        times = dict(zip([s.page for s in sources], pool.map(lambda s: render_page(s, root), sources), strict=True))
    return times
