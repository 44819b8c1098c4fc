"""The README's layout table names exactly the packages the tree holds, and the README points at files that exist."""

from __future__ import annotations

import re

import pytest

from servelab.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
LIB = REPO_ROOT / "lib" / "servelab"


def packages(root):
    """Directories one level under ``root`` that are Python packages (hold an ``__init__.py``)."""
    return {d.name for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists()}


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section, up to the next ``## `` heading."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    if m is None:
        raise AssertionError(f"README.md has no '## {title}' section")
    return m.group(1)


def table_rows(text: str) -> list[tuple[str, str]]:
    """(first cell, second cell) of each body row of the Markdown tables in ``text``."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-: ") and cells[0] != "path":
            rows.append((cells[0], cells[1]))
    return rows


LAYOUT = table_rows(section(README, "Layout"))


def test_layout_table_names_every_package_of_the_library_and_no_other():
    named = {m for first, _ in LAYOUT for m in re.findall(r"`lib/servelab/(\w+)/`", first)}
    assert named == packages(LIB), (
        f"missing from the table: {packages(LIB) - named}; not in the tree: {named - packages(LIB)}"
    )


def test_layout_table_names_every_study_package_and_no_other():
    row = [what for first, what in LAYOUT if first == "`lib/servelab/studies/`"]
    assert len(row) == 1, "the layout table needs one row for `lib/servelab/studies/`"
    named = set(re.findall(r"`(\w+)/`", row[0]))
    assert named == packages(LIB / "studies")


def test_every_path_the_layout_table_names_exists():
    paths = [p for first, _ in LAYOUT for p in re.findall(r"`([^`]+)`", first)]
    assert len(paths) >= len(packages(LIB)) + 2
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert not missing, missing


@pytest.mark.parametrize(
    "path",
    sorted(set(re.findall(r"(?<![\w/.])((?:data|lib|scripts|tests|book)/[\w./-]+\.(?:json|py|sh|ipynb|csv))", README))),
)
def test_files_the_readme_names_exist(path):
    assert (REPO_ROOT / path).exists(), f"README.md names {path}, which is not in the tree"
