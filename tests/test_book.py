"""The book's generated parts: seed claims, the studies' findings (``StudyEvidence``, what ``prepare`` keeps of each
study's report), the findings table, and `prepare`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.markdown import TABLE_CLASS, format_value, md_text
from servelab_book.__main__ import main
from servelab_book.beyond_one_gpu import INCLUDES as BEYOND_INCLUDES
from servelab_book.claim_links import claim_target, findings_anchor
from servelab_book.controlled import INCLUDES as CONTROLLED_INCLUDES
from servelab_book.findings import (
    NOT_CONVERTED,
    FindingsError,
    StudyEvidence,
    book_findings,
    book_runs,
    study_evidence,
)
from servelab_book.findings_table import (
    NOT_MEASURED,
    FindingsMismatch,
    findings_table,
    one_line,
    render_landing_table,
    render_summary,
    verdict_counts,
)
from servelab_book.prepare import prepare
from servelab_book.reproduce import parameters_source, render_reproduce
from servelab_book.seed_claims import SEED_CLAIMS_CSV, claim_anchor, claim_sort_key, load_seed_claims
from servelab_book.studies import STUDIES, STUDIES_DIR, PageConflict, page_title, study_pages

REAL_PLACEHOLDERS = STUDIES_DIR


# ---- fixtures: a scratch book with placeholders, results and notebooks ---------------------------


@pytest.fixture
def studies_dir(tmp_path) -> Path:
    """A placeholder page for every study (the committed one where it still exists), so tests can add
    executed notebooks beside them."""
    d = tmp_path / "book" / "studies"
    d.mkdir(parents=True)
    for s in STUDIES:
        real = REAL_PLACEHOLDERS / f"{s.slug}.md"
        if real.exists():
            shutil.copy(real, d / real.name)
        else:
            (d / real.name).write_text(f"# Study {s.number}: {s.title}\n\nNot yet measured.\n")
    return d


def executed_notebook(path: Path, findings_heading: str | None = "## Findings") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Study 5: Attention kernels\n\nThe question.")]
    if findings_heading:
        nb.cells.append(
            nbformat.v4.new_markdown_cell(
                f"```python\n# {findings_heading[3:]} (in a fence: no heading)\n```\n\n{findings_heading}\n\nTakeaways."
            )
        )
    nbformat.write(nb, path)
    return path


RUN_META = {
    "git_commit": "0123456789abcdef",
    "started_utc": "2026-12-02T12:00:00+00:00",
    "device": {"name": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "driver": "580.1"},
    "ceilings": {"copy_gb_s": 4223.17, "matmul_tflop_s": 804.4, "matmul_dtype": "bfloat16"},
}
TESTED = "qwen2-0.5b (architecture-exact, random weights; bfloat16)"


def evidence(slug: str, findings=(), *, current=True, meta=None, **kw) -> StudyEvidence:
    """What ``prepare`` keeps of a study's report over 3 repeats measured on an H200 (``findings.study_evidence``)."""
    return StudyEvidence(
        slug,
        tuple(findings),
        measured=True,
        current=current,
        fingerprint="f" * 64,
        changed=() if current else ("lib/servelab/studies/s05_attention/measure.py",),
        repeats=3,
        device_name="NVIDIA H200",
        meta=dict(RUN_META, **(meta or {})),
        **kw,
    )


F5 = [
    Finding(
        id="F5.1",
        claim="sdpa vs naive",
        seed_value="7.64",
        measured_value="23.1234",
        unit="×",
        verdict="changes",
        note="cuDNN attention is the default on sm90. It fuses the softmax.",
        tested_on=TESTED,
        repeats=3,
        spread="20.1–25.3",
        repeat_verdicts="changes;changes;changes",
    ),
    Finding(
        id="F5.2",
        claim="memory",
        seed_value="25 vs 2.4",
        measured_value="1024.0",
        unit="×",
        verdict="holds",
        note="naive grows quadratically",
        tested_on=TESTED,
        repeats=3,
    ),
    Finding(
        id="F5.3",
        claim="kernel vs arch",
        seed_value="",
        measured_value="kernel",
        unit="",
        verdict="fails",
        note="a | pipe, *stars* and $dollars$",
        repeats=3,
    ),
]


# ---- seed claims ---------------------------------------------------------------------------------


def test_seed_claims_are_the_22_numbered_claims_in_order():
    seed = load_seed_claims()
    assert len(seed) == 22
    assert seed["id"].iloc[0] == "F1.1" and seed["id"].iloc[-1] == "F7.4"
    assert seed.groupby("study").size().to_dict() == {
        "01_scheduling": 3,
        "02_gpu_costs": 3,
        "03_speculative": 3,
        "04_kv_cache": 4,
        "05_attention": 3,
        "06_hf_assisted": 2,
        "07_prefix_cache": 4,
    }
    # every claim of the seed's summary table is in the data file, spelled the same way
    assert seed.set_index("id").loc["F5.1", "rtx2070_value"] == "7.64×"


def test_seed_claims_file_errors_are_clear(tmp_path):
    bad = pd.read_csv(SEED_CLAIMS_CSV, dtype=str)
    bad.loc[0, "study"] = "02_gpu_costs"
    bad.loc[1, "id"] = "F1"
    bad.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ValueError, match=r"F1\.1 is listed under study '02_gpu_costs'.*bad claim id 'F1'"):
        load_seed_claims(tmp_path / "c.csv")
    pd.read_csv(SEED_CLAIMS_CSV, dtype=str).head(21).to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(ValueError, match="21 claims, expected 22"):
        load_seed_claims(tmp_path / "short.csv")


def test_claim_ids_sort_numerically_and_anchor():
    assert sorted(["F2.10", "F2.9", "F1.3"], key=claim_sort_key) == ["F1.3", "F2.9", "F2.10"]
    assert claim_anchor("F4.3") == "claim-f4-3"
    with pytest.raises(ValueError, match="not a claim id"):
        claim_sort_key("G1.1")


# ---- study pages ---------------------------------------------------------------------------------


def test_committed_study_pages_follow_the_study_structure():
    """Every study has its one committed page, titled by its own heading "# Study N: ..."; a placeholder page also
    has the placeholder's sections and no numbers. Every study is measured now (the last placeholders went in
    6268353): checking placeholders alone, this test found none and could not fail, so every page's title is checked
    too (an executed notebook's sections are tests/test_study_page.py's)."""
    pages = study_pages()
    assert [p.study.slug for p in pages] == [s.slug for s in STUDIES]
    for page in pages:
        title = page_title(page.source)  # not page.title, which falls back to the study's name
        assert title and title.startswith(f"Study {page.study.number}: "), (page.source.name, title)
    for page in (p for p in pages if not p.measured):
        text = page.source.read_text()
        assert text.startswith(f"# Study {page.study.number}: ")
        assert ":::{admonition} Not yet measured" in text
        headings = re.findall(r"^## (.+)$", text, re.M)
        assert headings == [
            "Question",
            "Setup",
            "Results",
            "Findings",
            "Seed vs H200",
            "Limitations",
            "How to re-run this study",
        ]
        assert f"../_generated/claims/{page.study.slug}.md" in text
        issue = page.study.issue
        assert (f"issue #{issue}" in text) if issue else ("a later issue" in text)
        # no placeholder numbers: the only digits are the study number, claim ranges, issue and file names
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        prose = re.sub(
            r"F\d\.\d|Study \d|issue #\d+|\d\d_[a-z_]+|sm\d\d|Qwen2(-\d\.\dB)?|gpt2|float64|bf16|fp16|RTX 2070|H200"
            r"|\{cite:[pt]\}`[^`]+`",
            "",
            prose,
        )
        assert not re.search(r"\d", prose), re.search(r".{30}\d.{30}", prose)


def test_prepare_refuses_a_study_with_both_notebook_and_placeholder(studies_dir):
    executed_notebook(studies_dir / "05_attention.ipynb")
    with pytest.raises(PageConflict, match=r"05_attention: both 05_attention.ipynb .* delete the placeholder"):
        study_pages(studies_dir)
    (studies_dir / "05_attention.md").unlink()
    pages = {p.study.slug: p for p in study_pages(studies_dir)}
    assert pages["05_attention"].measured and not pages["04_kv_cache"].measured


def test_a_study_without_any_page_is_an_error(studies_dir):
    (studies_dir / "07_prefix_cache.md").unlink()
    with pytest.raises(PageConflict, match="07_prefix_cache: neither"):
        study_pages(studies_dir)


def test_claim_links_go_to_the_claim_or_the_findings_heading(studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb", "## Findings: seed vs H200")
    pages = {p.study.slug: p for p in study_pages(studies_dir)}
    assert claim_target(pages["04_kv_cache"], "F4.2") == "project:#claim-f4-2"
    assert findings_anchor(pages["05_attention"]) == "findings-seed-vs-h200"
    assert (
        claim_target(pages["05_attention"], "F5.1") == "project:/book/studies/05_attention.ipynb#findings-seed-vs-h200"
    )
    executed_notebook(studies_dir / "05_attention.ipynb", None)
    assert claim_target(pages["05_attention"], "F5.1") == "project:/book/studies/05_attention.ipynb"


# ---- findings ------------------------------------------------------------------------------------


def test_book_findings_keep_each_reports_findings_in_claim_order():
    ev = {
        "05_attention": evidence("05_attention", reversed(F5)),
        "02_gpu_costs": evidence("02_gpu_costs", current=False),  # measured, judged no claim: a run row only
    }
    f = book_findings(ev)
    assert f["id"].tolist() == ["F5.1", "F5.2", "F5.3"]
    assert f.loc[0, "measured_value"] == "23.1234"  # as the report gave it; formatting is the table's job
    assert (f.loc[0, "repeats"], f.loc[0, "spread"], f.loc[0, "freshness"]) == (3, "20.1–25.3", "fresh")
    assert set(f["study"]) == set(f["source"]) == {"05_attention"}
    assert book_runs(ev)["study"].tolist() == ["02_gpu_costs", "05_attention"]  # study order
    assert book_runs(ev).set_index("study").loc["02_gpu_costs", "freshness"] == "stale"
    assert book_findings({}).empty and book_runs({}).empty
    unmeasured = {"05_attention": StudyEvidence("05_attention", tuple(not_measured("05_attention", "why")), why="why")}
    assert book_runs(unmeasured).empty  # a report that did not run has no provenance
    assert set(book_findings(unmeasured)["verdict"]) == {"inconclusive"}


def test_only_the_book_device_counts_and_an_unconverted_study_reads_inconclusive(tmp_path, monkeypatch):
    """A CPU smoke run never becomes an H200 value; a study without both doors reads inconclusive, with why."""
    run = tmp_path / "cpu" / "02_gpu_costs" / "runs" / ("a" * 64) / "all" / "r0"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(dict(RUN_META, complete=True, fingerprint="a" * 64, part="all")))
    ev = study_evidence("02_gpu_costs", tmp_path, "h200")
    assert ev.reported and not ev.measured and ev.freshness == "no data" and ev.repeats == 0
    assert [f.id for f in ev.findings] == ["F2.1", "F2.2", "F2.3"]
    assert {f.verdict for f in ev.findings} == {"inconclusive"}  # nothing measured: never "fails"
    from servelab.studies.common.runs import study_runs

    assert study_runs("02_gpu_costs", tmp_path, device="cpu").measured  # the run is there, on another device
    import servelab_book.findings as book_findings_module

    unconverted = "06_hf_assisted"  # every study has both doors now: pretend one lacks them
    monkeypatch.setattr(book_findings_module, "converted", lambda slug: slug != unconverted)
    ev = study_evidence(unconverted, tmp_path, "h200")
    assert ev.why == NOT_CONVERTED and not ev.reported
    assert {f.verdict for f in ev.findings} == {"inconclusive"}
    assert all(NOT_CONVERTED in f.note for f in ev.findings)


def test_f23_takes_the_simulators_validation_as_its_evidence():
    own = Finding(
        id="F2.3",
        claim="default costs hold",
        seed_value="30-70",
        measured_value="7.4",
        unit="µs/token",
        verdict="changes",
        note="re-fit per GPU",
    )
    ev = {"02_gpu_costs": evidence("02_gpu_costs", [own])}
    assert book_findings(ev).loc[0, "verdict"] == "changes"  # no validation yet: the study's own verdict
    validation = Finding(
        id="F2.3",
        claim="the simulator's validation",
        seed_value="",
        measured_value="33.9",
        unit="% median |error|",
        verdict="fails",
        note="median error over held-out runs",
    )
    ev["08_simulator"] = evidence(
        "08_simulator", meta={"started_utc": "2026-12-03T00:00:00+00:00"}, evidence=(validation,)
    )
    row = book_findings(ev).iloc[0]
    assert (row["verdict"], row["measured_value"], row["claim"]) == ("fails", "33.9", "default costs hold")
    assert row["seed_value"] == "30-70"  # the claim and the seed's value stay the study's
    # the judging report's note first (the landing table shows a note's first sentence), then who judged it
    assert row["note"].startswith("median error over held-out runs. Judged by the simulator page's validation")
    assert "not by this study's data, which alone said: changes, 7.4 µs/token" in row["note"]
    assert (row["study"], row["source"]) == ("02_gpu_costs", "08_simulator")
    assert row["started_utc"] == "2026-12-03T00:00:00+00:00"  # the provenance is the validation's


def test_a_claim_given_by_the_wrong_study_or_twice_is_refused():
    wrong = Finding(**{**F5[0].row(), "id": "F4.1"})
    with pytest.raises(FindingsError, match="05_attention's report gives claim F4.1, which belongs to another study"):
        book_findings({"05_attention": evidence("05_attention", [F5[0], wrong])})
    with pytest.raises(FindingsError, match="05_attention's report gives claim F5.1 twice"):
        book_findings({"05_attention": evidence("05_attention", [F5[0], F5[0]])})
    with pytest.raises(ValueError, match="verdict must be one of"):  # a verdict the rules do not know: never made
        Finding(**{**F5[0].row(), "verdict": "maybe"})


# ---- the table -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("7.641234", "7.64"),
        ("4223.1", "4,223"),
        ("0.012345", "0.0123"),
        ("36864", "36,864"),
        ("36864.0", "36,864"),
        ("-1.5", "-1.5"),
        ("7.80", "7.8"),
        ("21923–47819", "21,923–47,819"),
        ("7.8 / 275.2", "7.8 / 275.2"),
        ("0", "0"),
        ("nan", "nan"),
        ("n=2 and n=12", "n=2 and n=12"),
    ],
)
def test_values_are_formatted_for_reading(raw, shown):
    assert format_value(raw) == shown


def test_text_is_escaped_for_myst_and_cut_to_one_line():
    assert md_text("a | b *c* $d$ {role}`x`\n(label)=") == r"a \| b \*c\* \$d\$ \{role\}\`x\` (label)="
    assert md_text("(label)= x") == r"\(label)= x" and md_text("- item") == r"\- item"
    assert md_text("1. first") == r"1\. first" and md_text("*x*") == r"\*x\*" and md_text("3.2 ms") == "3.2 ms"
    assert one_line("First sentence. Second one.") == "First sentence."
    assert one_line("a clause; then more") == "a clause…" and one_line("all of it") == "all of it"
    assert one_line("x" * 300).endswith("…") and len(one_line("x" * 300)) == 160


def test_findings_table_joins_seed_h200_and_pages(studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    ev = {
        "05_attention": evidence("05_attention", F5),
        "04_kv_cache": StudyEvidence(
            "04_kv_cache", tuple(not_measured("04_kv_cache", NOT_CONVERTED)), why=NOT_CONVERTED
        ),
    }
    table = findings_table(load_seed_claims(), book_findings(ev), study_pages(studies_dir))
    assert len(table) == 22 and table["id"].tolist() == load_seed_claims()["id"].tolist()
    row = table.set_index("id").loc["F5.1"]
    # a measured claim shows its value, the interval over its repeats, and its evidence
    shown = (row.rtx2070_value, row.h200_value, row.verdict)
    assert shown == ("7.64×", "23.1 × (3 repeats: 20.1–25.3)", "changes")
    assert (row.repeats, row.freshness, row.tested_on) == (3, "fresh", TESTED)
    assert row.link == "project:/book/studies/05_attention.ipynb#findings"
    unmeasured = table.set_index("id").loc["F4.1"]  # an unconverted study's claim: inconclusive, with the reason
    assert (unmeasured.verdict, unmeasured.h200_value) == ("inconclusive", NOT_MEASURED)
    assert unmeasured.reason == f"Not measured: {NOT_CONVERTED}" and unmeasured.freshness == "no data"
    nobody = table.set_index("id").loc["F1.1"]  # a claim no report judged
    assert nobody.verdict == "inconclusive" and "Study 1's report gives no verdict" in nobody.reason
    assert verdict_counts(table) == {
        "holds": 1,
        "changes": 1,
        "fails": 1,
        "inconclusive": 19,
        NOT_MEASURED: 19,
        "stale": 0,
    }
    assert render_summary(table).startswith(
        "Of the seed's 22 claims, 3 have H200 data: 1 holds, 1 changes and 1 fails; "
        "19 are not measured yet (inconclusive)."
    )
    md = render_landing_table(table)
    assert f":class: {TABLE_CLASS}" in md
    assert md.count("\n* - ") == 23  # header + 22 claims
    assert "[F5.1](project:/book/studies/05_attention.ipynb#findings)" in md
    assert "{bdg-warning}`changes`" in md and "{bdg-info}`inconclusive`" in md and "not yet measured" not in md
    assert "3 repeats; interval 20.1–25.3; qwen2-0.5b (random weights); fresh" in md  # the evidence: models too
    assert r"A \| pipe, \*stars\* and \$dollars\$." in md  # the reason: a sentence, escaped
    assert "cuDNN attention is the default on sm90." in md and "fuses the softmax" not in md  # one line


def test_a_claim_judged_on_other_runs_names_them_beside_its_studys_own(studies_dir):
    # the findings page named Study 2's runs above F2.3, which is judged on the simulator's replay of Study 1's
    from servelab_book.findings_table import render_by_study

    (studies_dir / "02_gpu_costs.md").unlink()
    executed_notebook(studies_dir / "02_gpu_costs.ipynb")
    own = [Finding(id=i, claim="c", seed_value="s", measured_value="7.4", unit="µs/token", verdict="changes",
                   note="own") for i in ("F2.1", "F2.3")]  # fmt: skip
    judged = Finding(id="F2.3", claim="v", seed_value="", measured_value="27.25", unit="%", verdict="fails",
                     note="The simulator's error is over its goal. More.")  # fmt: skip
    ev = {
        "02_gpu_costs": evidence("02_gpu_costs", own, run_commits=("216ef19aaa",) * 3,
                                 run_starts=("2026-12-03T18:04:00+00:00",) * 3),
        "08_simulator": evidence("08_simulator", evidence=(judged,), run_commits=("493e2b2fff",) * 3,
                                 run_starts=("2026-12-05T10:00:00+00:00",) * 3),
    }  # fmt: skip
    table = findings_table(load_seed_claims(), book_findings(ev), study_pages(studies_dir))
    study2 = render_by_study(table).split("## Study 2")[1].split("## Study 3")[0]
    assert "3 runs started 2026-12-03 18:04 UTC, at commit `216ef19`" in study2.split("\n\n")[1]
    assert "F2.3 is judged on other runs, which its Evidence names." in study2
    assert "judged on the simulator page, which replays Study 1's server runs (listed under Study 1)" in study2
    # neither the header nor F2.3's evidence cites the simulator's own runs: they time its speed, F2.3 reads none
    assert "493e2b2" not in study2 and "2026-12-05" not in study2
    assert one_line(table.set_index("id").loc["F2.3", "reason"]) == "The simulator's error is over its goal."


def test_findings_for_a_placeholder_page_are_refused(studies_dir):
    ev = {"05_attention": evidence("05_attention", F5)}
    with pytest.raises(FindingsMismatch, match=r"F5\.1 \(05_attention.md\).*delete the placeholder"):
        findings_table(load_seed_claims(), book_findings(ev), study_pages(studies_dir))
    # a study whose report measured nothing may keep its placeholder: nothing to show there
    unmeasured = {"05_attention": StudyEvidence("05_attention", tuple(not_measured("05_attention")))}
    assert len(findings_table(load_seed_claims(), book_findings(unmeasured), study_pages(studies_dir))) == 22


# ---- reproduce ------------------------------------------------------------------------------------


def test_reproduce_reads_each_notebooks_parameters(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('profile = "auto"\nseq_lens = None  # profile default')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Study 2"), cell]
    nbformat.write(nb, tmp_path / "02_gpu_costs.ipynb")
    assert parameters_source(tmp_path / "02_gpu_costs.ipynb").startswith('profile = "auto"')
    md = render_reproduce(tmp_path)
    assert "papermill --cwd notebooks notebooks/02_gpu_costs.ipynb out.ipynb -p profile full" in md
    # a GPU run never overwrites the committed page: only the replay writes there
    assert "book/studies/02_gpu_costs.ipynb -p profile full" not in md
    assert "book/studies/02_gpu_costs.ipynb -p profile replay" in md
    assert "seq_lens = None" in md
    assert "`notebooks/01_scheduling.ipynb`, is not written yet" in md
    nb.cells[1].metadata["tags"] = []
    nbformat.write(nb, tmp_path / "02_gpu_costs.ipynb")
    with pytest.raises(ValueError, match="no code cell tagged 'parameters'"):
        render_reproduce(tmp_path)


# ---- prepare, end to end -------------------------------------------------------------------------


def test_prepare_writes_deterministic_includes(tmp_path, studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    results = tmp_path / "results"
    results.mkdir()
    ev = {"05_attention": evidence("05_attention", F5, published=("23.1 ×", "sdpa over naive"), has_published=True)}
    gen = tmp_path / "generated"
    kwargs = dict(
        studies_dir=studies_dir,
        notebooks_dir=tmp_path / "nb",
        generated_dir=gen,
        mathjax_target=None,
        root=None,
        evidence=ev,
    )
    first = prepare(results, **kwargs)
    names = sorted(p.relative_to(gen).as_posix() for p in first.written)
    assert names == sorted(
        [
            "findings_summary.md",
            "findings_table.md",
            "findings_by_study.md",
            "runs_table.md",
            "reproduce.md",
            "engine_bench.md",
            "engine_decode.md",
            "engine_exactness.md",
            "engine_code_status.md",
            "engine_goals.md",
            "engine_failures.md",
            "engine_long_context.md",
            "engine_offline.md",
            "engine_mixed.md",
            "engine_e2e.md",
            "engine_exactness_trained.md",
            "engine_step_budget.md",
            "engine_step_reading.md",
            "engine_switches.md",
            "rule_changes.md",
            "rerun_check.md",
            "published.md",
        ]
        + [f"claims/{s.slug}.md" for s in STUDIES]
        + list(CONTROLLED_INCLUDES)
        + list(BEYOND_INCLUDES)
    )
    assert first.measured_pages == ["05_attention"] and first.counts["holds"] == 1 and not first.warnings
    snapshot = {p: p.read_bytes() for p in gen.rglob("*.md")}
    second = prepare(results, **kwargs)
    assert not second.written and len(second.unchanged) == len(snapshot)
    assert {p: p.read_bytes() for p in gen.rglob("*.md")} == snapshot
    runs = (gen / "runs_table.md").read_text()
    assert "NVIDIA H200" in runs and "4,223" in runs and "804" in runs
    assert "23.1 × (sdpa over naive)" in (gen / "published.md").read_text()  # the report's own value
    assert (
        "3 repeats; interval 20.1–25.3; qwen2-0.5b (random weights); fresh" in (gen / "findings_table.md").read_text()
    )
    claims = (gen / "claims/04_kv_cache.md").read_text()
    assert "(claim-f4-1)=\n### F4.1: " in claims and "36 KB/token" in claims


def test_cli_prepare_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    import servelab_book.prepare as prep

    def conflict(_):
        raise PageConflict("boom: fix it")

    monkeypatch.setattr(prep, "study_pages", conflict)
    assert main(["prepare", "--results", str(tmp_path)]) == 1
    assert "servelab_book prepare: boom: fix it" in capsys.readouterr().err


def test_pages_are_named_by_their_own_title(studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    titles = {p.study.slug: p.title for p in study_pages(studies_dir)}
    assert titles["05_attention"] == "Study 5: Attention kernels"  # the notebook's first `# ` heading
    assert titles["01_scheduling"].startswith("Study 1: ")


def test_engine_bench_table(tmp_path):
    from servelab_book.engine_bench import find_bench, render_engine_bench

    assert find_bench(tmp_path) is None
    assert "not been benchmarked on the H200 yet" in render_engine_bench(None)
    d = tmp_path / "nvidia-h200" / "engine"
    d.mkdir(parents=True)
    pd.DataFrame(
        [
            {"metric": "decode_ms_b1_ctx128", "value": 0.61234, "unit": "ms", "floor": 0.24},
            {"metric": "offline_tok_s", "value": 41234.7, "unit": "tok/s", "floor": ""},
        ]
    ).to_csv(d / "bench.csv", index=False)
    md = render_engine_bench(find_bench(tmp_path))
    # each metric in words with its identifier; a column the table does not know keeps its name
    assert "One decode step, batch 1, 128 tokens of context (`decode_ms_b1_ctx128`)" in md
    assert "0.612" in md and "41,235" in md and "  - floor\n" in md and "  - —" in md
    pd.DataFrame([{"metric": "x"}]).to_csv(d / "bench.csv", index=False)
    with pytest.raises(ValueError, match=r"missing columns \['value', 'unit'\]"):
        render_engine_bench(find_bench(tmp_path))


def test_prepare_checkout_builds_another_clones_book(tmp_path, monkeypatch):
    """A second checkout using this package (a shared venv) gets its own includes, not this one's."""
    from servelab_book.prepare import prepare_checkout

    monkeypatch.delenv("SERVELAB_RESULTS", raising=False)
    clone = tmp_path / "clone"
    (clone / "data" / "seed").mkdir(parents=True)
    shutil.copy(SEED_CLAIMS_CSV, clone / "data" / "seed" / "claims.csv")
    shutil.copy(REPO_ROOT / "data" / "rules.yml", clone / "data" / "rules.yml")
    shutil.copytree(
        REPO_ROOT / "book" / "studies", clone / "book" / "studies", ignore=shutil.ignore_patterns("*.ipynb")
    )
    for s in STUDIES:
        if not (clone / "book" / "studies" / f"{s.slug}.md").exists():
            (clone / "book" / "studies" / f"{s.slug}.md").write_text(f"# Study {s.number}: x\n")
    with pytest.raises(ValueError, match="not the book's root"):
        prepare_checkout(clone)
    (clone / "_toc.yml").write_text("root: book/intro\n")
    asked = []

    def reports(root, device):  # the studies' reports over the clone's results, not this checkout's
        asked.append((root, device))
        return {"01_scheduling": evidence("01_scheduling")}

    monkeypatch.setattr("servelab_book.prepare.all_evidence", reports)
    monkeypatch.setattr("servelab_book.prepare.vendor_mathjax", lambda target: target.mkdir(parents=True))
    report = prepare_checkout(clone)
    assert asked == [(clone.resolve() / "data" / "results", "h200")]
    assert all(p.is_relative_to(clone) for p in report.written)
    assert (clone / "book" / "_generated" / "findings_table.md").exists()
    assert (clone / "book" / "_static" / "mathjax").is_dir()
    assert "Study 1" in (clone / "book" / "_generated" / "runs_table.md").read_text()


def test_prepare_warns_about_a_report_that_did_not_run_and_lists_stale_data(tmp_path, studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    why = "its report failed: KeyError: 'ms' (report.py:12)"
    ev = {
        "05_attention": evidence("05_attention", F5, current=False),  # measured by older measuring code
        "04_kv_cache": StudyEvidence("04_kv_cache", tuple(not_measured("04_kv_cache", why)), why=why),
    }
    report = prepare(
        tmp_path / "results",
        studies_dir=studies_dir,
        notebooks_dir=tmp_path / "nb",
        generated_dir=tmp_path / "gen",
        mathjax_target=None,
        root=None,
        evidence=ev,
    )
    assert report.warnings == [f"04_kv_cache: every claim reads inconclusive: {why}"]
    assert report.stale_pages == ["05_attention"]
    summary = report.summary()
    assert f"\n  warning: 04_kv_cache: every claim reads inconclusive: {why}" in summary
    assert "\n  stale data (measured by older measuring code): 05_attention" in summary
    assert "3 rest on data measured by older code (stale)" in (tmp_path / "gen" / "findings_summary.md").read_text()


def test_mathjax_is_vendored_from_the_installed_package(tmp_path):
    from servelab_book.mathjax import ENTRY, PARTS, MathJaxMissing, mathjax_source, vendor_mathjax

    src = mathjax_source()  # the pinned sphinx-mathjax-offline ships MathJax 3
    assert "MathJax" in (src / ENTRY).read_text(errors="replace")
    target = tmp_path / "mathjax"
    (target / "stale.js").parent.mkdir(parents=True)
    (target / "stale.js").write_text("old")
    entry = vendor_mathjax(target, src)
    assert entry == target / ENTRY and entry.is_file() and not (target / "stale.js").exists()
    assert all((target / p).exists() for p in PARTS)
    assert any((target / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))  # fonts for offline math
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / ENTRY).write_text("//")
    with pytest.raises(MathJaxMissing, match="MathJax part input/tex not found"):
        vendor_mathjax(tmp_path / "out", partial)


def test_runs_table_shows_the_host_and_sm_clocks_or_not_recorded():
    from servelab_book.runs_table import render_runs_table

    device = dict(
        RUN_META["device"],
        cpu_model="AMD EPYC 9654 96-Core Processor",
        cpu_cores=16,
        clocks_start={"clocks.sm": "1980"},
        clocks_end={"clocks.sm": "1755"},
    )
    ev = {
        "01_scheduling": evidence("01_scheduling"),  # an old record: no host, no clocks
        "02_gpu_costs": evidence("02_gpu_costs", meta={"device": device}),
    }
    md = render_runs_table(book_runs(ev))
    rows = md.split("* - ")[2:]
    assert len(rows) == 2
    assert rows[0].count("not recorded") == 2 and "`0123456`" in rows[0]
    assert "AMD EPYC 9654 96-Core Processor, 16 cores" in rows[1] and "1,980 → 1,755" in rows[1]


def test_runs_table_names_every_run_and_commit_given_the_evidence():
    from servelab_book.runs_table import render_runs_table

    ev = {
        "02_gpu_costs": evidence(
            "02_gpu_costs",
            run_commits=("216ef19aaaa", "7e30f5abbbb", "216ef19aaaa"),
            run_starts=("2026-12-03T22:13:00+00:00", "2026-12-03T18:04:00+00:00", "2026-12-03T20:00:00+00:00"),
        )
    }
    md = render_runs_table(book_runs(ev), ev)
    row = md.split("* - ")[2]
    assert "3 runs, 2026-12-03 18:04 UTC → 2026-12-03 22:13 UTC" in row
    assert "`216ef19`, `7e30f5a`" in row
    assert "Runs (first → last start)" in md and "Run started" not in md
    assert "Run started" in render_runs_table(book_runs(ev))  # without the evidence: the first run's


def test_study_2s_page_and_the_books_findings_agree():
    """On this checkout: the findings the book shows for Study 2 (its report over the committed runs, at prepare time)
    are the verdict table its committed page shows: one report, two places, the same verdicts and values."""
    ev = study_evidence("02_gpu_costs", REPO_ROOT / "data" / "results")  # the committed runs (not the tests' scratch)
    assert ev.reported and ev.measured, ev.why
    nb = nbformat.read(STUDIES_DIR / "02_gpu_costs.ipynb", as_version=4)
    shown = [
        o["data"]["text/markdown"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/markdown" in o.get("data", {})
    ]
    from servelab.studies.s02_gpu_costs import report  # the page labels F2.3 as its own data's and its own reading

    assert report.verdict_table(ev.findings, ev.device_name) in shown
    f = book_findings({"02_gpu_costs": ev})
    assert f["id"].tolist() == ["F2.1", "F2.2", "F2.3"]
    assert f["verdict"].tolist() == [x.verdict for x in ev.findings]
    assert set(f["freshness"]) == {ev.freshness}


def test_a_studys_ceilings_come_from_the_first_of_its_runs_that_measured_them(tmp_path):
    # Study 3's first run is a controlled sweep, which measures no ceiling: the hardware table read "?" for it
    from types import SimpleNamespace

    from servelab_book.findings import _with_ceilings

    def run(ceilings):
        return SimpleNamespace(meta={"started_utc": "x", "ceilings": ceilings})

    runs = SimpleNamespace(runs=[run({}), run({"copy_gb_s": 4270.0}), run({"copy_gb_s": 1.0})])
    runs.meta = runs.runs[0].meta
    meta = _with_ceilings(runs)
    assert meta["ceilings"] == {"copy_gb_s": 4270.0} and meta["started_utc"] == "x"
    assert runs.runs[0].meta["ceilings"] == {}  # the run's own record is left as it was
