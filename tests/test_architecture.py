"""The tree is the architecture: the system never imports a study, and no two modules import each other.

Both rules are read from the source (every import, at module level or inside a function), so a lazy import
cannot hide a cycle or a dependency on a study.
"""

import ast
import graphlib
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"
PACKAGES = ("servelab", "servelab_book")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((LIB / pkg).rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports: ``from a.b import c`` counts as ``a.b.c`` where that is a module."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in MODULES and t != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_system_never_imports_a_study():
    offenders = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if m.startswith("servelab.") and not m.startswith("servelab.studies")
        for t in targets
        if t.startswith("servelab.studies")
    )
    assert not offenders, "\n".join(offenders)


def test_no_study_imports_another_studys_page():
    """A study may read another's data through that study's modules, never through its ``report`` (the other page
    whole): Study 3's α bands read Study 6's ``alpha``, not its report."""
    offenders = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if m.startswith("servelab.studies.s")
        for t in targets
        if t.startswith("servelab.studies.s") and t.endswith(".report") and t.split(".")[2] != m.split(".")[2]
    )
    assert not offenders, "\n".join(offenders)


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of imports (``a, b, ..., a``), or [] when there is none (the standard library's topological sort)."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_import_cycles():
    assert _cycle(GRAPH) == []


def test_the_import_reader_sees_the_imports_the_rules_above_judge():
    """The rules above pass on a graph with no edges, so the reader must see the imports that are there: one inside a
    function (Study 3's α bands read Study 6's ``alpha``; the rules registry reads Study 6's report) and a module
    imported from its package (``from servelab.server import routes_openai, routes_ops``)."""
    assert "servelab.studies.s06_hf_assisted.alpha" in GRAPH["servelab.studies.s03_speculative.measured_alpha"]
    assert "servelab.studies.s06_hf_assisted.report" in GRAPH["servelab.studies.common.rules"]
    assert {"servelab.server.routes_openai", "servelab.server.routes_ops"} <= GRAPH["servelab.server.app"]


def test_the_cycle_finder_finds_a_cycle():
    assert sorted(set(_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}))) == ["a", "b", "c"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(n for n, p in MODULES.items() if p.name == "__init__.py"))
def test_every_package_says_what_it_is(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc.split()) >= 5, f"{name}/__init__.py needs a docstring saying what the package is"


def _book_imports(path: Path) -> list[str]:
    """Every ``servelab_book`` import in one file (``import servelab_book.x``, ``from servelab_book[.x] import y``),
    read statically, at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        found += [f"line {node.lineno}: {n}" for n in names if n == "servelab_book" or n.startswith("servelab_book.")]
    return found


def test_the_studies_and_the_system_never_import_the_book():
    """The book's tooling (``servelab_book``) imports the studies, never the reverse: no module under
    ``lib/servelab/`` imports ``servelab_book``, so a study's reporting path runs without the book and a change to the
    book's tooling cannot change a study's page or its measurement fingerprint."""
    offenders = [
        f"{path.relative_to(LIB)} {hit}"
        for path in sorted((LIB / "servelab").rglob("*.py"))
        for hit in _book_imports(path)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_book_import_finder_sees_every_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import servelab_book\nimport servelab_book.findings as f\n"
        "def g():\n    from servelab_book.published import x\n    from servelab_bookish import y\n"
    )
    assert [h.split(": ")[1] for h in _book_imports(src)] == [
        "servelab_book",
        "servelab_book.findings",
        "servelab_book.published",
    ]


# an engine's internals, as code outside engine/ would reach them: issue 30's "one door" (the speculative driver that
# did so is retired; a server's gauges, a study's policy swap and the bench's logit probe go through Engine's methods)
ENGINE_INTERNALS = (".block_manager.", ".block_manager,", "runner.tables", "runner.graphs", "engine.pool")


def test_nothing_outside_the_engine_reaches_into_its_scheduler_state_tables_graphs_or_pool():
    found = [
        f"{p.relative_to(LIB)}: {needle}"
        for p in sorted(LIB.rglob("*.py"))
        if "engine" not in p.relative_to(LIB).parts[1:2]
        for needle in ENGINE_INTERNALS
        if needle in p.read_text()
    ]
    assert found == []
