"""Every study page shows its "Against published results" section, rendered for its own study, before the re-run
recipe; and every study's run applies the book's figure style."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import nbformat
import pytest

from servelab.paths import REPO_ROOT

PAGES = {
    "01_scheduling": "servelab.studies.s01_scheduling.report",
    "02_gpu_costs": "servelab.studies.s02_gpu_costs.report",
    "03_speculative": "servelab.studies.s03_speculative.report",
    "04_kv_cache": "servelab.studies.s04_kv_cache.report",
    "05_attention": "servelab.studies.s05_attention.page",
    "06_hf_assisted": "servelab.studies.s06_hf_assisted.report",
    "07_prefix_cache": "servelab.studies.s07_prefix_cache.page",
    "08_simulator": "servelab.studies.s08_simulator.page",
}
RUNS = {
    "01_scheduling": ("servelab.studies.s01_scheduling.run", "run"),
    "02_gpu_costs": ("servelab.studies.s02_gpu_costs.run", "run"),
    "03_speculative": ("servelab.studies.s03_speculative.run", "run_study"),
    "04_kv_cache": ("servelab.studies.s04_kv_cache.run", "run"),
    "05_attention": ("servelab.studies.s05_attention.page", "run"),
    "06_hf_assisted": ("servelab.studies.s06_hf_assisted.study", "run_study"),
    "07_prefix_cache": ("servelab.studies.s07_prefix_cache.page", "run"),
    "08_simulator": ("servelab.studies.s08_simulator.page", "run"),
}


@pytest.mark.parametrize("slug", list(PAGES))
def test_each_page_renders_its_own_studys_comparison(slug, monkeypatch):
    module = importlib.import_module(PAGES[slug])
    asked = []
    monkeypatch.setattr(module, "render_published", lambda study: asked.append(study) or f"table of {study}")
    assert module.published() == f"table of {slug}"
    assert asked == [slug]


@pytest.mark.parametrize("slug", list(PAGES))
def test_notebook_shows_the_section_before_the_rerun_recipe(slug):
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{slug}.ipynb", as_version=4)
    heads = [c.source.strip() for c in nb.cells if c.cell_type == "markdown"]
    assert "## Against published results" in heads
    i = next(i for i, c in enumerate(nb.cells) if c.source.strip() == "## Against published results")
    cell = nb.cells[i + 1]
    assert cell.cell_type == "code" and "published()" in cell.source
    assert "remove-input" in cell.metadata.get("tags", [])
    rerun = next(i for i, c in enumerate(nb.cells) if c.source.strip().startswith("## Re-run this study"))
    assert i + 1 < rerun


@pytest.mark.parametrize("slug", list(RUNS))
def test_each_run_applies_the_book_style_first(slug):
    module_name, fn = RUNS[slug]
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(importlib.import_module(module_name), fn))))
    body = tree.body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):  # the docstring
        body = body[1:]
    assert ast.unparse(body[0]) == "use_book_style()", ast.unparse(body[0])
