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
from servelab.studies.common.rerun import rerun_section
from servelab_book.reproduce import papermill_command, parameters_source, render_reproduce
from servelab_book.studies import STUDIES as BOOK_STUDIES
from servelab_book.studies import study_by_slug

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SLUGS = [s.slug for s in BOOK_STUDIES]  # every study page follows the contract (issue 26)


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
    split = _finding(
        id="F9.3", verdict="inconclusive", repeats=3, spread="2.9–5.5", repeat_verdicts="changes;holds;holds"
    )
    md = verdict_table([_finding(), _finding(id="F9.2", seed_value="", tested_on=""), split], "NVIDIA H200")
    lines = md.strip().splitlines()
    assert lines[0] == "| Claim | RTX 2070 (seed) | NVIDIA H200 | Unit | Repeats | Verdict | Tested on |"
    assert len(lines) == 5
    assert lines[2] == (
        "| **F9.1** decode is flat \\| memory-bound | 30–70 | 3.1–5.2 | µs/token | 1 | **changes** | "
        "qwen2-0.5b (architecture-exact, random weights) |"
    )
    assert lines[3].endswith("| — | 3.1–5.2 | µs/token | 1 | **changes** | — |")  # nothing typed where nothing is known
    # over repeats: the median with its interval, how many repeats, and what each said where they disagree
    assert lines[4].endswith(
        "| 3.1–5.2 (repeats: 2.9–5.5) | µs/token | 3 | **inconclusive** (changes, holds, holds) | "
        "qwen2-0.5b (architecture-exact, random weights) |"
    )
    assert md_cell("a\nb|c") == "a b\\|c"
    # a spread of the headline, in another unit than the value's, names its unit
    ratio = _finding(
        spread="0.21–0.44", headline=0.39, headline_unit="× the parameter ratio: eager over it (far < 0.5)"
    )
    assert "(repeats: 0.21–0.44 × the parameter ratio) | µs/token |" in verdict_table([ratio])


def test_a_claim_not_measured_says_why_in_its_takeaway():
    from servelab.studies.common.findings import not_measured

    f = not_measured("03_speculative", "its part real has no run at this fingerprint yet")[0]
    assert f.repeats == 0 and finding_sentence(f).endswith(
        ": not measured (its part real has no run at this fingerprint yet)."
    )


def test_the_banner_names_the_parts_not_measured_yet(tmp_path):
    import json

    from servelab.measure.fingerprint import fingerprint
    from servelab.studies.common.page import evidence_banner
    from servelab.studies.common.runs import study_runs

    fp = fingerprint("servelab.studies.s03_speculative.measure").digest
    for rep in range(3):
        d = tmp_path / "nvidia-h200" / "03_speculative" / "runs" / fp[:12] / "costs" / f"r{rep}"
        d.mkdir(parents=True)
        meta = dict(part="costs", repeat_index=rep, fingerprint=fp, complete=True, device={"name": "NVIDIA H200"})
        (d / "run.json").write_text(json.dumps(meta))
    text = evidence_banner(study_runs("03_speculative", tmp_path))
    assert "Parts measured: costs ×3." in text and "Not measured yet: real, lookup, controlled_qwen2" in text
    # three repeats begun, none of them whole: the banner says so
    assert "3 repeats; 0 with every part, and each verdict counts the repeats holding the parts it reads (3" in text


def test_takeaways_give_the_unit_only_to_a_bare_number():
    assert finding_sentence(_finding()) == "**F9.1 changes.** Decode is flat | memory-bound: 3.1–5.2 µs/token."
    worded = _finding(measured_value="tiny: 149.3 → 44.3 ms", unit="ms")
    assert finding_sentence(worded).endswith(": tiny: 149.3 → 44.3 ms.")
    assert takeaway_list(["one.", "", "  ", "two."]) == "- one.\n- two.\n"


def test_rerun_section_shows_the_replay_the_gpu_jobs_and_the_parameters_cell():
    md = rerun_section("02_gpu_costs")
    replay = "papermill --cwd notebooks notebooks/02_gpu_costs.ipynb book/studies/02_gpu_costs.ipynb -p profile replay"
    assert replay in md
    assert "make gpu-plan" in md and "scripts/gpu_run.sh 02_gpu_costs:all:0" in md
    assert "papermill --cwd notebooks notebooks/02_gpu_costs.ipynb out.ipynb -p profile full" in md
    assert f"```python\n{parameters_source(NOTEBOOKS / '02_gpu_costs.ipynb')}\n```" in md
    with pytest.raises(FileNotFoundError):
        rerun_section("99_nothing")
    with pytest.raises(ParameterError, match="slug"):
        rerun_section("notebooks/02_gpu_costs.ipynb")


def _code_lines(nb) -> int:
    return sum(len([x for x in c.source.splitlines() if x.strip()]) for c in nb.cells if c.cell_type == "code")


def _one(cells, pattern: str) -> int:
    """The index of the one cell whose source matches ``pattern``."""
    found = [i for i, c in enumerate(cells) if re.search(pattern, c.source, re.M)]
    assert len(found) == 1, (pattern, found)
    return found[0]


@pytest.mark.parametrize("slug", SLUGS)
def test_study_notebook_follows_the_contracts_layout(slug):
    """The measure/report contract's notebook: the question, the parameters, ``R = page(...)``, the evidence banner,
    Findings (verdict table and takeaways), the key figure, Method, Details, Limitations, Against published results,
    Re-run this study; every code cell out of sight (removed, or its input removed), and thin."""
    nb = nbformat.read(NOTEBOOKS / f"{slug}.ipynb", as_version=4)
    cells = nb.cells
    tags = [set(c.metadata.get("tags", [])) for c in cells]
    code = [i for i, c in enumerate(cells) if c.cell_type == "code"]
    number = int(slug[:2])
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith(f"# Study {number}: ")
    assert "**The question.**" in cells[0].source
    assert cells[1].cell_type == "code" and {"parameters", "remove-cell"} <= tags[1]
    assert cells[1].source.startswith('profile = "auto"')
    assert cells[2].cell_type == "code" and "remove-cell" in tags[2]
    assert f'R = page("{slug}", profile, globals())' in cells[2].source
    # every code cell hidden: removed, or its input removed (no folded "hide-input")
    assert all(tags[i] & {"remove-cell", "remove-input"} and "hide-input" not in tags[i] for i in code)
    assert _code_lines(nb) - len(cells[1].source.splitlines()) <= 100
    headings = [  # a section may say what it is about after a colon: "## Method: the paged KV cache"
        m.split(":")[0] for c in cells if c.cell_type == "markdown" for m in re.findall(r"^## (.+)$", c.source, re.M)
    ]
    sections = ["Findings", "Method", "Details", "Limitations", "Against published results", "Re-run this study"]
    assert headings == sections
    banner = _one(cells, r"^show\(evidence_banner\(R\.runs\)\)")
    findings = _one(cells, r"^## Findings")
    # Study 2 labels F2.3's cell as its own data's (the book's F2.3 is the simulator's): report.own_data_f23
    table = _one(
        cells, r"verdict_table\((report\.own_data_f23\()?R\.findings\)?, R\.device\),(.|\n)*report\.takeaways\(R\)"
    )
    method = _one(cells, r"^## Method")
    assert 2 < banner < findings < table < method
    figure = [i for i in range(table + 1, method) if cells[i].cell_type == "code" and "show(" in cells[i].source]
    assert len(figure) == 1, "the one key figure, with its caption, between the findings and the method"
    assert re.search(r'"\*[^"]+', cells[figure[0]].source), "the figure is shown with a caption"
    published = _one(cells, r"^## Against published results")
    assert "show(report.published(R))" in cells[published + 1].source
    rerun = _one(cells, r"^## Re-run this study")
    assert cells[rerun + 1].source.strip() == f'show(rerun_section("{slug}"))'
    assert rerun + 2 == len(cells)


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


def test_a_claims_note_starts_a_sentence_and_says_how_many_repeats_its_value_stands_for():
    one = finding_notes([_finding()])
    assert "**F9.1 changes.** Decode is flat | memory-bound. RTX 2070: 30–70; measured here: 3.1–5.2" in one
    three = finding_notes([_finding(repeats=3, repeat_verdicts="changes;changes;changes")])
    assert "measured here (3 repeats): 3.1–5.2 (µs/token)" in three


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
    assert f"```bash\n{command}\n# more\n```" in md
    # the methodology page's section is the study page's re-run section: a full run goes to a notebook of its own
    assert rerun_section("07_prefix_cache") in render_reproduce(NOTEBOOKS)
    assert command not in render_reproduce(NOTEBOOKS)
    simulator = rerun_recipe("08_simulator", {}, out="book/simulator.ipynb")
    assert "papermill --cwd notebooks notebooks/08_simulator.ipynb book/simulator.ipynb -p profile full" in simulator
    # the simulator page's re-run section wrote its replay into book/studies/, where the book has no such page

    section = rerun_section("08_simulator")
    assert "notebooks/08_simulator.ipynb book/simulator.ipynb -p profile replay" in section
    assert "book/studies/08_simulator" not in section
    with pytest.raises(ParameterError, match="slug"):
        rerun_recipe("notebooks/07_prefix_cache.ipynb", {})
    assert "# more" in md and "`seed=0`" in md
    assert parameters_source(REPO_ROOT / "notebooks" / "07_prefix_cache.ipynb") in md


def test_prose_quotes_the_seed_from_its_claims_file():
    from servelab.studies.common.findings import seed_value
    from servelab.studies.s01_scheduling.verdicts import _seed_cut

    assert seed_value("F5.1") == "7.64×" and seed_value("F5.2") == "25× vs 2.4×"
    assert _seed_cut("F1.1") == "58.6 ms → 34.1 ms (a 42% cut)"  # the cut computed from the seed's two numbers


def test_study2s_fit_table_has_readers_headers():
    from servelab.studies.s02_gpu_costs.report import fit_label

    assert fit_label("step_heldout_mixed_median_abs_pct") == "step model held-out, mixed: median |error| %"
    assert fit_label("prefill_median_abs_pct") == "prefill fit: median |error| %"
    assert fit_label("step_fit_max_abs_pct") == "step model fit: max |error| %"
    assert fit_label("step_rows") == "step model rows" and fit_label("model") == "model"
