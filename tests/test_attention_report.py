"""Study 5's two doors: the measuring path imports nothing that reports, and the reporting path judges F5.1–F5.3 from
raw run files (nothing measured, three repeats, a changed number, a deleted table)."""

from __future__ import annotations

import pytest
from study_run_fixtures import drop, write_runs

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import study_runs
from servelab.studies.s05_attention import report

STUDY = "05_attention"
RAW = ["dispatch", "prefill", "decode", "masks"]


def test_the_measuring_path_imports_nothing_that_reports():
    files = fingerprint("servelab.studies.s05_attention.measure").files
    banned = ("report", "plots", "verdicts", "tables", "recommend", "derived", "servelab_book", "common/page",
              "common/runs", "common/study", "common/published", "common/markdown")  # fmt: skip
    assert not [f for f in files if any(b in f for b in banned)]
    assert "lib/servelab/studies/s05_attention/sweep.py" in files


def test_nothing_measured_is_inconclusive_and_empty(tmp_path):
    r = report.report(study_runs(STUDY, tmp_path))
    assert [f.id for f in r.findings] == ["F5.1", "F5.2", "F5.3"]
    assert {f.verdict for f in r.findings} == {"inconclusive"} and r.prefill.empty
    assert report.published_value(r.runs) is None and report.takeaways(r) == ""
    assert "not measured" in report.published(r)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    root = write_runs(tmp_path_factory.mktemp("three"), STUDY, RAW)
    return report.report(study_runs(STUDY, root))


def test_three_repeats_of_the_legacy_data_give_the_rules_verdicts(three):
    v = {f.id: f for f in three.findings}
    assert v["F5.1"].verdict == "holds" and v["F5.1"].measured_value == "8.1" and v["F5.1"].repeats == 3
    assert v["F5.2"].verdict == "changes" and v["F5.3"].verdict == "holds"
    assert three.runs.current is False and len(three.runs.repeats) == 3
    assert report.published_value(three.runs)[0] == "616 TFLOP/s"
    assert not three.recommendations.empty and set(three.spread["regime"]) == {"prefill", "decode"}


def test_a_changed_raw_number_changes_the_verdict_and_the_value(tmp_path):
    def slower_naive(name, df):
        if name == "prefill":
            at = df["variant"].eq("naive") & df["q_len"].eq(2048) & df["arch"].eq("qwen2-1.5b") & df["head_dim"].eq(128)
            df.loc[at, "median_ms"] *= 20
            best = df["variant"].eq("sdpa_default") & df["q_len"].eq(16384) & df["arch"].eq("qwen2-1.5b")
            df.loc[best & df["head_dim"].eq(128), "median_ms"] /= 1.1
        return df

    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW, edit=slower_naive)))
    f51 = r.findings[0]
    assert f51.verdict == "changes" and float(f51.measured_value) == pytest.approx(162, rel=0.01)
    assert report.published_value(r.runs)[0] == "677 TFLOP/s"


def test_one_repeat_is_inconclusive_and_a_deleted_table_does_not_crash(tmp_path):
    root = write_runs(tmp_path, STUDY, RAW, repeats=1)
    r = report.report(study_runs(STUDY, root))
    assert {f.verdict for f in r.findings} == {"inconclusive"} and "rests on 1 repeat" in r.findings[0].note
    drop(root, STUDY, "prefill")
    r = report.report(study_runs(STUDY, root))
    assert [f.id for f in r.findings] == ["F5.1", "F5.2", "F5.3"] and r.prefill.empty and r.speedups.empty
    assert "not judged" in r.findings[0].note and report.published_value(r.runs) is None
    assert report.takeaways(r) and report.setup(r)
