"""The book's generated parts: seed claims, H200 findings, the findings table, and `prepare`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from servelab.paths import REPO_ROOT
from servelab.studies.common.markdown import TABLE_CLASS, format_value, md_text
from servelab_book.__main__ import main
from servelab_book.claim_links import claim_target, findings_anchor
from servelab_book.controlled import INCLUDES as CONTROLLED_INCLUDES
from servelab_book.findings import FindingsError, book_findings, book_runs
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
from servelab_book.studies import STUDIES, STUDIES_DIR, PageConflict, study_pages

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


def write_run(root: Path, slug: str, study: str, findings: list[dict] | None, started="2026-12-02T12:00:00+00:00"):
    d = root / slug / study
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(
        json.dumps(
            {
                "study": study,
                "git_commit": "0123456789abcdef",
                "started_utc": started,
                "device": {"name": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "driver": "580.1"},
                "ceilings": {"copy_gb_s": 4223.17, "matmul_tflop_s": 804.4, "matmul_dtype": "bfloat16"},
            }
        )
    )
    if findings is not None:
        pd.DataFrame(findings).to_csv(d / "findings.csv", index=False)
    return d


F5 = [
    {
        "id": "F5.1",
        "claim": "sdpa vs naive",
        "seed_value": 7.64,
        "measured_value": 23.1234,
        "unit": "×",
        "verdict": "changes",
        "note": "cuDNN attention is the default on sm90. It fuses the softmax.",
    },
    {
        "id": "F5.2",
        "claim": "memory",
        "seed_value": "25 vs 2.4",
        "measured_value": 1024.0,
        "unit": "×",
        "verdict": "holds",
        "note": "naive grows quadratically",
    },
    {
        "id": "F5.3",
        "claim": "kernel vs arch",
        "seed_value": "",
        "measured_value": "kernel",
        "unit": "",
        "verdict": "fails",
        "note": "a | pipe, *stars* and $dollars$",
    },
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


def test_committed_placeholders_follow_the_study_structure():
    for page in study_pages():
        if page.measured:
            continue
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


def test_only_the_h200_counts_and_the_latest_run_wins(tmp_path):
    write_run(tmp_path, "cpu", "05_attention", F5)  # a smoke run must never become an H200 value
    write_run(tmp_path, "nvidia-h200", "05_attention", [dict(F5[0], measured_value=1.0)], "2026-12-01T00:00:00+00:00")
    write_run(tmp_path, "nvidia-h200-nvl", "05_attention", F5, "2026-12-02T00:00:00+00:00")
    write_run(tmp_path, "nvidia-h200", "02_gpu_costs", None)  # a run that wrote no findings yet
    f = book_findings(tmp_path)
    assert f["id"].tolist() == ["F5.1", "F5.2", "F5.3"]
    assert set(f["device_slug"]) == {"nvidia-h200-nvl"}
    assert f.loc[0, "measured_value"] == "23.1234"  # as written; formatting is the table's job
    runs = book_runs(tmp_path)
    assert runs["study"].tolist() == ["02_gpu_costs", "05_attention"]
    assert book_findings(tmp_path / "nothing").empty


def test_f23_takes_the_simulators_validation_as_its_evidence(tmp_path):
    own = {
        "id": "F2.3",
        "claim": "default costs hold",
        "seed_value": "30-70",
        "measured_value": "7.4",
        "unit": "µs/token",
        "verdict": "changes",
        "note": "re-fit per GPU",
    }
    write_run(tmp_path, "nvidia-h200", "02_gpu_costs", [own])
    assert book_findings(tmp_path).loc[0, "verdict"] == "changes"  # no validation run yet: the study's own row
    sim = write_run(tmp_path, "nvidia-h200", "08_simulator", None, "2026-12-03T00:00:00+00:00")
    pd.DataFrame(
        [
            dict(
                own,
                measured_value="33.9",
                unit="% median |error|",
                verdict="fails",
                note="median error over held-out runs",
            )
        ]
    ).to_csv(sim / "f23_evidence.csv", index=False)
    row = book_findings(tmp_path).iloc[0]
    assert (row["verdict"], row["measured_value"], row["claim"]) == ("fails", "33.9", "default costs hold")
    assert "the study's own run alone said: changes, 7.4 µs/token" in row["note"]
    assert row["study"] == "02_gpu_costs" and row["started_utc"] == "2026-12-03T00:00:00+00:00"
    pd.DataFrame([dict(own, verdict="perhaps")]).to_csv(sim / "f23_evidence.csv", index=False)
    with pytest.raises(FindingsError, match="f23_evidence.csv"):
        book_findings(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"verdict": "maybe"}, "verdict must be one of"),
        ({"id": "F4.1"}, "claim F4.1 belongs to study 4, not to 05_attention"),
        ({"id": "X"}, "not a claim id"),
    ],
)
def test_bad_findings_are_refused_with_the_file_named(tmp_path, change, message):
    write_run(tmp_path, "nvidia-h200", "05_attention", [dict(F5[0], **change)])
    with pytest.raises(FindingsError, match=f"findings.csv: .*{message}"):
        book_findings(tmp_path)


def test_missing_findings_columns_are_refused(tmp_path):
    d = write_run(tmp_path, "nvidia-h200", "05_attention", None)
    pd.DataFrame([{"id": "F5.1", "verdict": "holds"}]).to_csv(d / "findings.csv", index=False)
    with pytest.raises(FindingsError, match="missing columns"):
        book_findings(tmp_path)


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


def test_findings_table_joins_seed_h200_and_pages(tmp_path, studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    write_run(tmp_path, "nvidia-h200", "05_attention", F5)
    table = findings_table(load_seed_claims(), book_findings(tmp_path), study_pages(studies_dir))
    assert len(table) == 22 and table["id"].tolist() == load_seed_claims()["id"].tolist()
    row = table.set_index("id").loc["F5.1"]
    assert (row.rtx2070_value, row.h200_value, row.verdict) == ("7.64×", "23.1 ×", "changes")
    assert row.link == "project:/book/studies/05_attention.ipynb#findings"
    unmeasured = table.set_index("id").loc["F4.1"]
    assert unmeasured.verdict == NOT_MEASURED and "issue #4" in unmeasured.reason
    assert verdict_counts(table) == {"holds": 1, "changes": 1, "fails": 1, "inconclusive": 0, NOT_MEASURED: 19}
    assert render_summary(table).startswith(
        "Of the seed's 22 claims, 3 have been measured on the H200: "
        "1 hold, 1 change and 1 fail; 19 are not yet measured."
    )
    md = render_landing_table(table)
    assert f":class: {TABLE_CLASS}" in md
    assert md.count("\n* - ") == 23  # header + 22 claims
    assert "[F5.1](project:/book/studies/05_attention.ipynb#findings)" in md
    assert "{bdg-warning}`changes`" in md and "{bdg-muted}`not yet measured`" in md
    assert r"a \| pipe, \*stars\* and \$dollars\$" in md
    assert "cuDNN attention is the default on sm90." in md and "fuses the softmax" not in md  # one line


def test_findings_for_a_placeholder_page_are_refused(tmp_path, studies_dir):
    write_run(tmp_path, "nvidia-h200", "05_attention", F5)
    with pytest.raises(FindingsMismatch, match=r"F5\.1 \(05_attention.md\).*delete the placeholder"):
        findings_table(load_seed_claims(), book_findings(tmp_path), study_pages(studies_dir))


# ---- reproduce ------------------------------------------------------------------------------------


def test_reproduce_reads_each_notebooks_parameters(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('profile = "auto"\nseq_lens = None  # profile default')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Study 2"), cell]
    nbformat.write(nb, tmp_path / "02_gpu_costs.ipynb")
    assert parameters_source(tmp_path / "02_gpu_costs.ipynb").startswith('profile = "auto"')
    md = render_reproduce(tmp_path)
    assert (
        "papermill --cwd notebooks notebooks/02_gpu_costs.ipynb book/studies/02_gpu_costs.ipynb -p profile full" in md
    )
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
    write_run(results, "nvidia-h200", "05_attention", F5)
    gen = tmp_path / "generated"
    kwargs = dict(
        studies_dir=studies_dir, notebooks_dir=tmp_path / "nb", generated_dir=gen, mathjax_target=None, root=None
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
            "scheduling_step_costs.md",
            "rule_changes.md",
            "published.md",
        ]
        + [f"claims/{s.slug}.md" for s in STUDIES]
        + list(CONTROLLED_INCLUDES)
    )
    assert first.measured_pages == ["05_attention"] and first.counts["holds"] == 1 and not first.warnings
    snapshot = {p: p.read_bytes() for p in gen.rglob("*.md")}
    second = prepare(results, **kwargs)
    assert not second.written and len(second.unchanged) == len(snapshot)
    assert {p: p.read_bytes() for p in gen.rglob("*.md")} == snapshot
    runs = (gen / "runs_table.md").read_text()
    assert "NVIDIA H200" in runs and "4,223" in runs and "804" in runs
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
    assert "decode\\_ms\\_b1\\_ctx128" in md and "0.612" in md and "41,235" in md and "floor" in md and "  - —" in md
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
    write_run(clone / "data" / "results", "nvidia-h200", "01_scheduling", None)
    monkeypatch.setattr("servelab_book.prepare.vendor_mathjax", lambda target: target.mkdir(parents=True))
    report = prepare_checkout(clone)
    assert all(p.is_relative_to(clone) for p in report.written)
    assert (clone / "book" / "_generated" / "findings_table.md").exists()
    assert (clone / "book" / "_static" / "mathjax").is_dir()
    assert "Study 1" in (clone / "book" / "_generated" / "runs_table.md").read_text()


def test_prepare_warns_about_an_executed_page_without_an_h200_run(tmp_path, studies_dir):
    (studies_dir / "05_attention.md").unlink()
    executed_notebook(studies_dir / "05_attention.ipynb")
    write_run(tmp_path / "results", "cpu", "05_attention", F5)  # e.g. a smoke run copied into the book
    report = prepare(
        tmp_path / "results",
        studies_dir=studies_dir,
        notebooks_dir=tmp_path / "nb",
        generated_dir=tmp_path / "gen",
        mathjax_target=None,
        root=None,
    )
    assert report.warnings == [
        "book/studies/05_attention.ipynb is an executed notebook, but the results hold no "
        "'h200' run of 05_attention (a smoke run, or results not committed?)"
    ]
    assert "\n  warning: book/studies/05_attention.ipynb" in report.summary()


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


def test_runs_table_shows_the_host_and_sm_clocks_or_not_recorded(tmp_path):
    from servelab_book.runs_table import render_runs_table

    write_run(tmp_path, "nvidia-h200", "01_scheduling", None)  # an old record: no host, no clocks
    d = write_run(tmp_path, "nvidia-h200", "02_gpu_costs", None)
    side = json.loads((d / "run.json").read_text())
    side["device"].update(
        cpu_model="AMD EPYC 9654 96-Core Processor",
        cpu_cores=16,
        clocks_start={"clocks.sm": "1980"},
        clocks_end={"clocks.sm": "1755"},
    )
    (d / "run.json").write_text(json.dumps(side))
    md = render_runs_table(book_runs(tmp_path))
    rows = md.split("* - ")[2:]
    assert len(rows) == 2
    assert rows[0].count("not recorded") == 2 and "`0123456`" in rows[0]
    assert "AMD EPYC 9654 96-Core Processor, 16 cores" in rows[1] and "1,980 → 1,755" in rows[1]


def test_prepare_notes_each_executed_pages_run_and_lists_the_stale_ones(tmp_path):
    """On this checkout: every executed page gets its run's note; a page whose code changed is listed."""
    from servelab_book.page_banner import load_banner
    from servelab_book.staleness import PAGES

    gen = tmp_path / "gen"
    report = prepare(
        REPO_ROOT / "data" / "results",
        studies_dir=STUDIES_DIR,
        notebooks_dir=tmp_path / "nb",
        generated_dir=gen,
        mathjax_target=None,
    )
    runs = json.loads((gen / "page_runs.json").read_text())
    executed = [p.page for p in PAGES if (REPO_ROOT / p.page).is_file()]
    assert sorted(runs) == sorted(executed)
    assert report.stale_pages == [p for p in executed if runs[p]["status"] == "stale"]
    for page, run in runs.items():
        assert f"commit `{run['commit'][:7]}`" in load_banner(page, gen)
        assert (run["status"] == "stale") == (":class: servelab-stale" in run["banner"])
