"""The code a notebook runs: the files of ``lib/`` its imports reach, followed through every module they import.

The import closure itself is ``servelab.measure.fingerprint``'s (the measuring paths are fingerprinted with it); this
module reads a notebook's code cells into it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat

from servelab.measure.fingerprint import ROOTS, closure, imported, module_files

__all__ = ["ROOTS", "module_files", "notebook_code", "reached_files", "notebook_deps"]


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one Python source (IPython magics and shell lines dropped)."""
    nb = nbformat.read(path, as_version=4)
    lines = [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if not line.lstrip().startswith(("%", "!"))
    ]
    return "\n".join(lines)


def reached_files(code: str, lib: Path) -> list[Path]:
    """The files of ``lib/`` that running ``code`` imports, directly or through other modules, sorted."""
    return closure(imported(ast.parse(code), "__main__", False), lib)


def notebook_deps(notebook: Path, lib: Path) -> list[Path]:
    """The source notebook and every file of ``lib/`` its code reaches."""
    return [notebook, *reached_files(notebook_code(notebook), lib)]
