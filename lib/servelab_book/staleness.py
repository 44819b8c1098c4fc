"""Which executed pages ran on older code: each page's run commit against today's tree, computed with git.

A page is the executed copy of a source notebook (``book/studies/NN_*.ipynb`` of ``notebooks/NN_*.ipynb``,
``book/simulator.ipynb`` of ``notebooks/08_simulator.ipynb``); its run's commit is the ``git_commit`` of its
study's ``run.json``. The page is

- ``current`` when none of the files it depends on (``code_deps.notebook_deps``: the source notebook and the
  modules of ``lib/`` its imports reach) differs between that commit and the working tree;
- ``stale`` when some do: the page shows a banner naming them (``prepare`` writes the banners, the notebook
  reader puts them on the page);
- ``unknown`` when git cannot tell: no repository (the GPU machine's clean export has no ``.git``), or a commit
  this history lacks. The page says so instead of claiming to be current.

Separately, ``source_changed`` says whether the source notebook's *cells* changed since the run: the notebook-cell
test expects those pages to differ from their source.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from servelab.paths import REPO_ROOT
from servelab_book.code_deps import notebook_deps
from servelab_book.notebook_cells import cells_of_text
from servelab_book.studies import STUDIES

BOOK_DEVICE_GLOB = "*h200*"
SIMULATOR = ("book/simulator.ipynb", "notebooks/08_simulator.ipynb", "08_simulator")


@dataclass(frozen=True)
class Page:
    """An executed page and where its run is recorded (paths relative to the repository root)."""

    page: str  # book/studies/01_scheduling.ipynb
    source: str  # notebooks/01_scheduling.ipynb
    results: str  # the results folder whose run.json holds the run's commit: 01_scheduling

    @property
    def docname(self) -> str:
        return self.page.removesuffix(".ipynb")


PAGES: tuple[Page, ...] = tuple(
    Page(f"book/studies/{s.slug}.ipynb", f"notebooks/{s.slug}.ipynb", s.slug) for s in STUDIES
) + (Page(*SIMULATOR),)


@dataclass(frozen=True)
class PageStatus:
    page: str
    commit: str  # the run's commit as run.json records it ("" when no run is recorded)
    status: str  # current / stale / unknown
    changed: tuple[str, ...] = ()  # dependency files that differ since the run
    behind: int | None = None  # commits since the run that touched lib/ or notebooks/
    reason: str = ""  # for unknown: why git could not tell

    def as_dict(self) -> dict:
        return {**asdict(self), "changed": list(self.changed)}


def git(root: Path, *args: str) -> str | None:
    """git's stdout in ``root``, or None when git fails or there is no repository."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def run_commit(page: Page, results_root: Path) -> str:
    """The commit the page's study ran at, from its H200 ``run.json`` (latest device folder); "" if none."""
    found = sorted(results_root.glob(f"{BOOK_DEVICE_GLOB}/{page.results}/run.json"))
    if not found:
        return ""
    return str(json.loads(found[-1].read_text()).get("git_commit") or "")


def _known(root: Path, commit: str) -> str | None:
    """Why git cannot compare with ``commit`` in ``root``, or None when it can."""
    if not commit:
        return "no run of it is recorded"
    if git(root, "rev-parse", "--git-dir") is None:
        return "this copy of the repository has no git history"
    if git(root, "cat-file", "-e", f"{commit.removesuffix('+dirty')}^{{commit}}") is None:
        return f"its run's commit {commit[:12]} is not in this repository's history"
    return None


def page_status(page: Page, root: Path = REPO_ROOT, results_root: Path | None = None) -> PageStatus:
    """Compare one page's run commit with the working tree of ``root`` on the files the page depends on."""
    root = Path(root)
    commit = run_commit(page, Path(results_root or root / "data" / "results"))
    why = _known(root, commit)
    if why is None and not (root / page.source).is_file():
        why = f"its source notebook {page.source} does not exist"
    if why is not None:
        return PageStatus(page.page, commit, "unknown", reason=why)
    base = commit.removesuffix("+dirty")
    deps = [p.relative_to(root).as_posix() for p in notebook_deps(root / page.source, root / "lib")]
    changed = tuple(sorted((git(root, "diff", "--name-only", base, "--", *deps) or "").split()))
    behind = git(root, "rev-list", "--count", f"{base}..HEAD", "--", "lib", "notebooks")
    return PageStatus(page.page, commit, "stale" if changed else "current", changed, int(behind) if behind else None)


def source_changed(page: Page, root: Path = REPO_ROOT, results_root: Path | None = None) -> str:
    """Why the source notebook's cells differ from those at the page's run ("" when they are the same):
    the notebook-cell test expects such a page to differ from its source."""
    root = Path(root)
    commit = run_commit(page, Path(results_root or root / "data" / "results"))
    why = _known(root, commit)
    if why is not None:
        return why
    then = git(root, "show", f"{commit.removesuffix('+dirty')}:{page.source}")
    if then is None:
        return f"{page.source} did not exist at the run's commit {commit[:12]}"
    now = (root / page.source).read_text(encoding="utf-8")
    if cells_of_text(then) != cells_of_text(now):
        return f"{page.source}'s cells changed since the run at {commit[:12]}"
    return ""
