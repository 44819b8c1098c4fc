"""Every study page shows its "Against published results" section, computed by its own reporting path and placed
before the re-run recipe; nothing measured reads "not measured", never a crash."""

from __future__ import annotations

import importlib

import nbformat
import pytest

from servelab.paths import REPO_ROOT
from servelab.studies.common.published import NOT_MEASURED, load_published, published_section
from servelab.studies.common.runs import RunSet

STUDIES = [
    "01_scheduling",
    "02_gpu_costs",
    "03_speculative",
    "04_kv_cache",
    "05_attention",
    "06_hf_assisted",
    "07_prefix_cache",
    "08_simulator",
]


@pytest.mark.parametrize("slug", STUDIES)
def test_nothing_measured_has_no_published_counterpart(slug):
    report = importlib.import_module(f"servelab.studies.s{slug}.report")
    assert report.published_value(RunSet(slug)) is None


@pytest.mark.parametrize("slug", sorted(set(load_published()["study"])))
def test_the_section_pairs_each_published_number_with_ours_or_not_measured(slug):
    shown = published_section(slug, ("12.5 ×", "what it is"), "NVIDIA H200")
    assert "12.5 ×" in shown and "NVIDIA H200 (this book)" in shown and "{cite:p}" in shown
    assert NOT_MEASURED in published_section(slug, None)


@pytest.mark.parametrize("slug", STUDIES)
def test_notebook_shows_the_section_before_the_rerun_recipe(slug):
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{slug}.ipynb", as_version=4)
    heads = [c.source.strip() for c in nb.cells if c.cell_type == "markdown"]
    assert "## Against published results" in heads
    i = next(i for i, c in enumerate(nb.cells) if c.source.strip() == "## Against published results")
    cell = nb.cells[i + 1]
    assert cell.cell_type == "code" and "published(R)" in cell.source
    assert "remove-input" in cell.metadata.get("tags", [])
    rerun = next(i for i, c in enumerate(nb.cells) if c.source.strip().startswith("## Re-run this study"))
    assert i + 1 < rerun
