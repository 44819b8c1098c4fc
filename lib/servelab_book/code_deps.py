"""The code a notebook runs: the files of ``lib/`` its imports reach, followed through every module they import.

Used to say whether an executed page is stale: its run's commit is compared with today's tree on exactly these
files and the source notebook. Imports are read statically (``ast``), module by module, so a page depends on the
system modules its study really uses, not on the whole of ``lib/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat

ROOTS = ("servelab", "servelab_book")  # the repository's packages under lib/; other imports are third-party


def module_files(lib: Path) -> dict[str, Path]:
    """Every module under ``lib/<root>/`` by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for root in ROOTS:
        for path in sorted((lib / root).rglob("*.py")):
            parts = list(path.relative_to(lib).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Dotted names a module's code imports (``from a import b`` gives ``a`` and ``a.b``: b may be a module)."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in ROOTS}


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


def _with_parents(name: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def reached_files(code: str, lib: Path) -> list[Path]:
    """The files of ``lib/`` that running ``code`` imports, directly or through other modules, sorted."""
    modules = module_files(lib)
    todo = [m for n in _imported(ast.parse(code), "__main__", False) for m in _with_parents(n) if m in modules]
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = modules[mod]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in _imported(tree, mod, path.name == "__init__.py"):
            todo += [m for m in _with_parents(name) if m in modules and m not in seen]
    return sorted(modules[m] for m in seen)


def notebook_deps(notebook: Path, lib: Path) -> list[Path]:
    """The source notebook and every file of ``lib/`` its code reaches."""
    return [notebook, *reached_files(notebook_code(notebook), lib)]
