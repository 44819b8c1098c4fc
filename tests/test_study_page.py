"""The first screen of a study page: the verdict table and takeaways built from Finding records, the re-run recipe,
and the shape of Studies 1, 2 and 4's notebooks (findings first, code out of sight, thin)."""

import re
from pathlib import Path

import nbformat
import pytest

from servelab.studies.common.findings import Finding
from servelab.studies.common.page import finding_sentence, md_cell, takeaway_list, verdict_table
from servelab_book.reproduce import parameters_source, rerun_markdown

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
