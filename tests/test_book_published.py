"""The findings page's "Against published results": each study's value from its report's ``published_value``, never
typed and never read from its folders here; "not measured", with the reason, where a report gives none."""

from __future__ import annotations

from servelab.studies.common.markdown import md_text
from servelab.studies.common.published import load_published
from servelab_book.findings import NOT_CONVERTED, StudyEvidence
from servelab_book.published import render_all_published


def test_each_studys_value_comes_from_its_report_and_a_missing_one_says_why():
    pub = load_published()
    studies = sorted(set(pub["study"]))
    evidence = {s: StudyEvidence(s, (), why=NOT_CONVERTED) for s in studies}
    evidence[studies[0]] = StudyEvidence(
        studies[0], (), measured=True, published=("1.23 ×", "best speedup measured"), has_published=True
    )
    md = render_all_published(evidence)
    assert md.count("### ") == len(studies) and "### The simulator" in md  # the Vidur comparison is the simulator's
    first = md.split("### ")[1]
    assert "1.23 × (best speedup measured)" in first
    assert f"not measured ({NOT_CONVERTED})" in md.split("### ")[2]
    evidence[studies[0]] = StudyEvidence(studies[0], (), measured=True, has_published=False)
    shown = md_text("not measured (its report gives no published_value)")  # as MyST source: the reader sees it plain
    assert shown in render_all_published(evidence).split("### ")[1]
