"""A notebook's cells as the reader sees them written: (type, source), outputs and metadata left out.

An executed page must hold its source notebook's cells and nothing else: prose lives in the source (or is
generated from data at run time), never edited in the executed copy. Papermill adds one cell, tagged
``injected-parameters``, with the values it ran with; that one is not part of the comparison.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

INJECTED = "injected-parameters"


def cells_of(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell type, source) of every cell but papermill's injected parameters, trailing whitespace ignored."""
    return [
        (c.cell_type, c.source.rstrip()) for c in nb.cells if INJECTED not in (c.get("metadata", {}).get("tags") or [])
    ]


def cells_of_text(text: str) -> list[tuple[str, str]]:
    return cells_of(nbformat.reads(text, as_version=4))


def cells_of_file(path: Path) -> list[tuple[str, str]]:
    return cells_of(nbformat.read(path, as_version=4))


def first_difference(page: list[tuple[str, str]], source: list[tuple[str, str]]) -> str:
    """Where two cell lists first differ, for a test's message ("" when they are equal)."""
    for i, (a, b) in enumerate(zip(page, source, strict=False)):
        if a != b:
            return f"cell {i}: page has {a[0]} {a[1][:60]!r}…, source has {b[0]} {b[1][:60]!r}…"
    if len(page) != len(source):
        return f"page has {len(page)} cells, source {len(source)}"
    return ""
