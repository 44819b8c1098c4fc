"""The findings-first page parts every study shares (studies.common.page), and the notebooks' parameters cells."""

import ast
import importlib

import pytest

from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import Finding
from servelab.studies.common.page import finding_notes, rerun_recipe, takeaway_list
from servelab_book.reproduce import parameters_source

STUDIES = {
    "05_attention": "servelab.studies.s05_attention.params",
    "07_prefix_cache": "servelab.studies.s07_prefix_cache.params",
    "08_simulator": "servelab.studies.s08_simulator.params",
}


def _finding(**kw):
    base = dict(
        id="F9.1",
        claim="a claim",
        seed_value="2×",
        measured_value="3.5",
        unit="×",
        verdict="changes",
        note="rule",
        tested_on="m (bf16), random weights",
    )
    return Finding(**{**base, **kw})


def test_takeaways_and_notes_skip_nothing_but_empty_sentences():
    assert takeaway_list(["one.", "", "  ", "two."]) == "- one.\n- two.\n"
    assert "**F9.1 changes.**" in finding_notes([_finding()]) and "rule." in finding_notes([_finding()])


@pytest.mark.parametrize("slug", sorted(STUDIES))
def test_the_parameters_cell_is_the_one_place_each_parameter_is_written(slug):
    """Every study parameter appears in the notebook's parameters cell, set to None (the profile's default), and
    nothing else but the profile: the next cell feeds them to study_params with overrides_from(globals())."""
    defaults = importlib.import_module(STUDIES[slug]).DEFAULTS
    names = set().union(*(d.keys() for d in defaults.values()))
    cell = ast.parse(parameters_source(REPO_ROOT / "notebooks" / f"{slug}.ipynb"))
    assigned = {t.id: a.value for a in cell.body for t in a.targets}
    assert set(assigned) == names | {"profile"}
    assert all(isinstance(v, ast.Constant) and v.value is None for k, v in assigned.items() if k != "profile")


def test_rerun_recipe_shows_the_command_the_parameters_cell_and_the_values_used():
    md = rerun_recipe("07_prefix_cache", {"profile": "smoke", "seed": 0}, extra=["# more"])
    assert "papermill notebooks/07_prefix_cache.ipynb book/studies/07_prefix_cache.ipynb --cwd notebooks" in md
    assert "# more" in md and "`seed=0`" in md
    assert parameters_source(REPO_ROOT / "notebooks" / "07_prefix_cache.ipynb") in md
