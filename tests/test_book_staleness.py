"""Which pages ran on older code: the import closure a notebook reaches, its run commit against the tree (git),
the banner the page shows, and the reader that puts it under the title."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from servelab_book.code_deps import notebook_deps
from servelab_book.notebook_reader import add_banner
from servelab_book.page_banner import changed_summary, load_banner, render_banner, render_runs_file
from servelab_book.staleness import PAGES, PageStatus, page_status, source_changed

PAGE = PAGES[0]  # book/studies/01_scheduling.ipynb of notebooks/01_scheduling.ipynb


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def notebook(path: Path, *cells: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Study 1: x")] + [nbformat.v4.new_code_cell(c) for c in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A tiny checkout: a study package importing a system module (relatively and absolutely), an unrelated
    module, the source notebook, and an H200 run recorded at the first commit."""
    write(tmp_path / "lib/servelab/__init__.py", "")
    write(tmp_path / "lib/servelab/engine/__init__.py", "from .core import step\n")
    write(tmp_path / "lib/servelab/engine/core.py", "def step():\n    return 1\n")
    write(tmp_path / "lib/servelab/sim/__init__.py", "")  # nothing the study imports
    write(tmp_path / "lib/servelab/studies/__init__.py", "")
    write(tmp_path / "lib/servelab/studies/s01_x/__init__.py", "")
    write(tmp_path / "lib/servelab/studies/s01_x/verdicts.py", "from servelab.engine import step\nimport numpy\n")
    write(tmp_path / "lib/servelab_book/__init__.py", "")
    notebook(tmp_path / PAGE.source, "%matplotlib inline\nfrom servelab.studies.s01_x import verdicts")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "first")
    write(
        tmp_path / "data/results/nvidia-h200" / PAGE.results / "run.json",
        json.dumps({"git_commit": git(tmp_path, "rev-parse", "HEAD")}),
    )
    return tmp_path


def test_a_notebook_depends_on_the_modules_its_imports_reach(repo):
    deps = {p.relative_to(repo).as_posix() for p in notebook_deps(repo / PAGE.source, repo / "lib")}
    assert deps == {
        PAGE.source,
        "lib/servelab/__init__.py",
        "lib/servelab/engine/__init__.py",
        "lib/servelab/engine/core.py",  # through the package's relative import
        "lib/servelab/studies/__init__.py",
        "lib/servelab/studies/s01_x/__init__.py",
        "lib/servelab/studies/s01_x/verdicts.py",
    }


def test_a_page_is_current_until_its_code_changes(repo):
    assert page_status(PAGE, repo).status == "current" and source_changed(PAGE, repo) == ""
    write(repo / "lib/servelab/sim/__init__.py", "X = 1\n")  # code the page does not reach
    assert page_status(PAGE, repo).status == "current"
    write(repo / "lib/servelab/engine/core.py", "def step():\n    return 2\n")
    git(repo, "commit", "-qam", "engine")
    status = page_status(PAGE, repo)
    assert status.status == "stale" and status.changed == ("lib/servelab/engine/core.py",) and status.behind == 1
    assert source_changed(PAGE, repo) == ""  # the code changed, the notebook's cells did not
    notebook(repo / PAGE.source, "from servelab.studies.s01_x import verdicts\nprint(1)")
    assert PAGE.source in page_status(PAGE, repo).changed
    assert "cells changed since the run" in source_changed(PAGE, repo)


def test_without_git_or_a_known_commit_the_page_says_it_could_not_tell(repo):
    run = repo / "data/results/nvidia-h200" / PAGE.results / "run.json"
    run.write_text(json.dumps({"git_commit": "f" * 40}))
    status = page_status(PAGE, repo)
    assert status.status == "unknown" and "not in this repository's history" in status.reason
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)  # the GPU machine's clean export
    status = page_status(PAGE, repo)
    assert status.status == "unknown" and "no git history" in status.reason
    assert "could not be checked: this copy of the repository has no git history" in render_banner(status)
    run.unlink()
    assert page_status(PAGE, repo).reason == "no run of it is recorded"


def test_the_banner_names_the_commit_and_what_changed(tmp_path):
    changed = ("notebooks/01_scheduling.ipynb",) + tuple(f"lib/servelab/engine/m{i}.py" for i in range(3))
    changed += ("lib/servelab/studies/s01_scheduling/plots.py", "lib/servelab/paths.py")
    stale = PageStatus(PAGE.page, "1b233dd8489c", "stale", changed, 19)
    banner = render_banner(stale)
    assert banner.startswith(":::{warning}\n:class: servelab-stale\nThis page is the H200 run at commit `1b233dd`.")
    assert "(6 files, over 19 commits)" in banner
    assert changed_summary(changed) == (
        "`notebooks/01_scheduling.ipynb`, `lib/servelab/engine/` (3 files), `lib/servelab/paths.py`, "
        "`lib/servelab/studies/s01_scheduling/`"
    )
    current = render_banner(PageStatus(PAGE.page, "abcdef0123", "current"))
    assert ":class: servelab-run\n" in current and "has not changed since" in current
    (tmp_path / "page_runs.json").write_text(render_runs_file([stale]))
    assert load_banner(PAGE.page, tmp_path) == banner and load_banner("book/other.ipynb", tmp_path) is None


def test_the_reader_puts_the_note_under_the_title():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("# Study 1: x\n\nThe question.")]
    nb = add_banner(nb, ":::{note}\nrun\n:::\n")
    assert [c.cell_type for c in nb.cells] == ["code", "markdown", "markdown"] and nb.cells[2].source.startswith(
        ":::{note}"
    )
    assert len(add_banner(nb, None).cells) == 3
