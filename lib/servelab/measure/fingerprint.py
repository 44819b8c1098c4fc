"""A measuring path's fingerprint: the hash of every source file its import closure reaches.

A study's data is only as current as the code that measured it.
``fingerprint("servelab.studies.s02_gpu_costs.measure")``
follows that module's imports statically (``ast``), module by module, through every package of ``lib/`` it reaches
(importing ``a.b.c`` runs ``a`` and ``a.b`` too), and hashes the files' contents. Nothing is listed by hand, so a new
import is in the fingerprint the moment it is written, and a module the measuring path does not import (a plot, a
verdict rule, a page) can change without making any data stale.

Code is hashed, not commits: the GPU machine's copy of the tree has no git history, and two commits that leave
the measuring files' code alone give the same fingerprint. Comments and docstrings are not code (``code_of``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from servelab.paths import REPO_ROOT

LIB = REPO_ROOT / "lib"
ROOTS = ("servelab", "servelab_book")  # the repository's packages under lib/; other imports are third-party
DIGITS = 12  # of the SHA-256, as folder names and page banners show it
SELF = Path(__file__).resolve()  # this module: in every closure (results.py imports it), never in a fingerprint


def module_files(lib: Path = LIB) -> dict[str, Path]:
    """Every module under ``lib/<root>/`` by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for root in ROOTS:
        for path in sorted((lib / root).rglob("*.py")):
            parts = list(path.relative_to(lib).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Dotted names a module's code imports (``from a import b`` gives ``a`` and ``a.b``: b may be a module).

    Imports inside functions count: a measuring path that imports lazily still runs that code."""
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


def with_parents(name: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def closure(start: set[str], lib: Path = LIB) -> list[Path]:
    """The files of ``lib/`` that importing the modules ``start`` runs, directly or through others, sorted."""
    modules = module_files(lib)
    todo = [m for n in start for m in with_parents(n) if m in modules]
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = modules[mod]
        for name in _imports_of(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py"):
            todo += [m for m in with_parents(name) if m in modules and m not in seen]
    return sorted(modules[m] for m in seen)


# Parsing is what a fingerprint costs: `make gpu-plan` takes some 30 fingerprints over the same ~150 files, and
# parsed each file anew every time (45 of its 51 s on 2026-12-07). Both caches are keyed by the source text itself,
# so an edited file is parsed again and nothing can go stale.
@functools.lru_cache(maxsize=8192)
def _imports_of(source: str, module: str, is_package: bool) -> frozenset[str]:
    return frozenset(imported(ast.parse(source), module, is_package))


@functools.lru_cache(maxsize=8192)
def _code_hash(source: str) -> str:
    return hashlib.sha256(code_of(source).encode()).hexdigest()[:16]


def code_of(source: str) -> str:
    """What a module does, without its words: the source with every comment and every module, class and function
    docstring removed, trailing spaces and blank lines dropped. Rewording a comment or a package docstring (one that
    lists a new module, say) leaves the data current; any change to what runs does not.

    Text, not ``ast.dump``: the AST's dump changes between Python versions (3.12 adds fields), and the GPU machine
    runs another Python than this one; docstring lines and comment positions are the same in every version."""
    tree = ast.parse(source)
    lines = source.splitlines()
    drop: set[int] = set()  # 0-based lines of docstrings
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                drop.update(range(first.lineno - 1, first.end_lineno))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    kept = (line.rstrip() for i, line in enumerate(lines) if i not in drop)
    return "\n".join(line for line in kept if line)


def file_hash(path: Path) -> str:
    """The hash of a source file's code (``code_of``), 16 hex digits."""
    return _code_hash(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Fingerprint:
    """The measuring path ``module``'s fingerprint: ``digest`` over ``files`` (path relative to the repository:
    content hash), so that a stale page can name the files that changed since its data was measured."""

    module: str
    digest: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.digest[:DIGITS]

    def changed_since(self, files: dict[str, str]) -> list[str]:
        """The files whose content differs from ``files`` (a run's record), added or removed, sorted."""
        return sorted(p for p in set(self.files) | set(files) if self.files.get(p) != files.get(p))


def fingerprint(module: str, lib: Path = LIB) -> Fingerprint:
    """The fingerprint of importing ``module`` (a dotted name under ``lib/``); raises if it is not there."""
    if module not in module_files(lib):
        raise ModuleNotFoundError(f"no module {module!r} under {lib}")
    root = lib.parent
    files = {
        p.relative_to(root).as_posix(): file_hash(p)
        for p in closure({module}, lib)
        if p.resolve() != SELF  # how a run is labelled is not how it measures
    }
    digest = hashlib.sha256("".join(f"{p}:{h}\n" for p, h in sorted(files.items())).encode()).hexdigest()
    return Fingerprint(module, digest, files)
