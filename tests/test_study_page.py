"""The findings-first parts every study page shares (studies.common.page): the verdict table and takeaways built
from Finding records, the notes, the re-run recipe; each notebook's parameters cell; and the shape of the notebooks
(findings first, code out of sight, thin)."""

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from servelab.errors import ParameterError
from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import Finding
from servelab.studies.common.page import (
    finding_notes,
    finding_sentence,
    md_cell,
    rerun_recipe,
    takeaway_list,
    verdict_table,
)
from servelab_book.reproduce import papermill_command, parameters_source, rerun_markdown
from servelab_book.studies import study_by_slug

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
THIN = ("01_scheduling", "02_gpu_costs", "04_kv_cache")


def _finding(**kw):
    base = dict(
        id="F9.1",
        claim="decode is flat | memory-bound",
        seed_value="30–70",
        measured_value="3.1–5.2",
        unit="µs/token",
        verdict="changes",
        note="why",
        tested_on="qwen2-0.5b (architecture-exact, random weights)",
    )
    return Finding(**{**base, **kw})


def test_verdict_table_has_one_row_per_finding_with_pipes_escaped():
    md = verdict_table([_finding(), _finding(id="F9.2", seed_value="", tested_on="")], "NVIDIA H200")
    lines = md.strip().splitlines()
    assert lines[0] == "| Claim | RTX 2070 (seed) | NVIDIA H200 | Unit | Verdict | Tested on |"
    assert len(lines) == 4
    assert lines[2] == (
        "| **F9.1** decode is flat \\| memory-bound | 30–70 | 3.1–5.2 | µs/token | **changes** | "
        "qwen2-0.5b (architecture-exact, random weights) |"
    )
    assert lines[3].endswith("| — | 3.1–5.2 | µs/token | **changes** | — |")  # nothing typed where nothing is known
    assert md_cell("a\nb|c") == "a b\\|c"


def test_takeaways_give_the_unit_only_to_a_bare_number():
    assert finding_sentence(_finding()) == "**F9.1 changes.** Decode is flat | memory-bound: 3.1–5.2 µs/token."
    worded = _finding(measured_value="tiny: 149.3 → 44.3 ms", unit="ms")
    assert finding_sentence(worded).endswith(": tiny: 149.3 → 44.3 ms.")
    assert takeaway_list(["one.", "", "  ", "two."]) == "- one.\n- two.\n"


def test_rerun_markdown_shows_the_parameters_cell():
    md = rerun_markdown("01_scheduling")
    assert "papermill --cwd notebooks notebooks/01_scheduling.ipynb book/studies/01_scheduling.ipynb" in md
    assert parameters_source(NOTEBOOKS / "01_scheduling.ipynb") in md
    with pytest.raises(KeyError):
        rerun_markdown("99_nothing")


def _code_lines(nb) -> int:
    return sum(len([x for x in c.source.splitlines() if x.strip()]) for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("slug", THIN)
def test_study_notebook_is_thin_and_findings_first(slug):
    nb = nbformat.read(NOTEBOOKS / f"{slug}.ipynb", as_version=4)
    tags = [set(c.metadata.get("tags", [])) for c in nb.cells]
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    params = [i for i in code if "parameters" in tags[i]]
    assert len(params) == 1 and "remove-cell" in tags[params[0]]
    # no parameter is written twice: the run cell takes them from the parameters cell's namespace
    assert any("overrides_from(globals(), DEFAULTS)" in nb.cells[i].source for i in code)
    assert _code_lines(nb) - len(nb.cells[params[0]].source.splitlines()) <= 100
    # every code input is out of sight (removed or folded)
    assert all(tags[i] & {"remove-cell", "remove-input", "hide-input"} for i in code)
    # the question, then Findings (the verdict table, the takeaways) before any method or detail section
    headings = [m for c in nb.cells if c.cell_type == "markdown" for m in re.findall(r"^##+ (.+)$", c.source, re.M)]
    assert headings[0] == "Findings", headings
    first_md = nb.cells[0].source
    assert first_md.startswith("# Study") and "**The question.**" in first_md
    after = nb.cells[[i for i, c in enumerate(nb.cells) if "## Findings" in c.source][0] + 1 :]
    assert "verdict_table(R.findings" in after[0].source and "report.takeaways(R)" in after[1].source
    assert "Re-run" in headings[-1] and "rerun_markdown" in nb.cells[-1].source


STUDIES = {
    "05_attention": "servelab.studies.s05_attention.params",
    "07_prefix_cache": "servelab.studies.s07_prefix_cache.params",
    "08_simulator": "servelab.studies.s08_simulator.params",
}


def test_takeaways_and_notes_skip_nothing_but_empty_sentences():
    assert takeaway_list(["one.", "", "  ", "two."]) == "- one.\n- two.\n"
    assert "**F9.1 changes.**" in finding_notes([_finding(note="rule")]) and "rule." in finding_notes(
        [_finding(note="rule")]
    )


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
    # the page's command is the methodology page's, from one builder (studies.common.rerun)
    command = papermill_command(study_by_slug("07_prefix_cache"))
    assert command == (
        "papermill --cwd notebooks notebooks/07_prefix_cache.ipynb book/studies/07_prefix_cache.ipynb -p profile full"
    )
    assert f"```bash\n{command}\n# more\n```" in md and command in rerun_markdown("07_prefix_cache")
    simulator = rerun_recipe("08_simulator", {}, out="book/simulator.ipynb")
    assert "papermill --cwd notebooks notebooks/08_simulator.ipynb book/simulator.ipynb -p profile full" in simulator
    with pytest.raises(ParameterError, match="slug"):
        rerun_recipe("notebooks/07_prefix_cache.ipynb", {})
    assert "# more" in md and "`seed=0`" in md
    assert parameters_source(REPO_ROOT / "notebooks" / "07_prefix_cache.ipynb") in md
