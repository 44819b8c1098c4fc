"""`servelab_book check` on small hand-made sites: each problem it exists to catch is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from servelab_book.__main__ import main
from servelab_book.check import BOOK_PAGES, FINDINGS, LANDING, check_book, remote_resources
from servelab_book.findings_table import TABLE_CLASS
from servelab_book.seed_claims import load_seed_claims
from servelab_book.studies import STUDIES

CLAIMS = load_seed_claims()["id"].tolist()


def page(body: str, head: str = "") -> str:
    return f"<html><head>{head}<script src='../_static/x.js'></script></head><body><main>{body}</main></body></html>"


def table(ids) -> str:
    rows = "".join(f"<tr><td><a href='studies/01_scheduling.html#claim-f1-1'>{i}</a></td><td>x</td></tr>" for i in ids)
    return f"<table class='table {TABLE_CLASS}'><thead><tr><th>Claim</th></tr></thead><tbody>{rows}</tbody></table>"


@pytest.fixture
def site(tmp_path) -> Path:
    """A minimal book that passes every check."""
    for name in BOOK_PAGES:
        (tmp_path / f"{name}.html").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{name}.html").write_text(
            page(f"<h1>{name}</h1><p>See <a href='methodology.html#roofline'>x</a><span id='roofline'></span></p>")
        )
    for s in STUDIES:
        (tmp_path / s.html_path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / s.html_path).write_text(
            page(f"<h1 id='claim-f{s.number}-1'>Study {s.number}</h1><a href='../intro.html'>home</a>")
        )
    (tmp_path / LANDING).write_text(page(table(CLAIMS)))
    (tmp_path / FINDINGS).write_text(page(table(CLAIMS[:3]) + table(CLAIMS[3:])))
    (tmp_path / "_static" / "mathjax").mkdir(parents=True)
    (tmp_path / "_static" / "mathjax" / "tex-chtml.js").write_text("// mathjax")
    (tmp_path / "_static" / "x.js").write_text("")
    (tmp_path / "_static" / "theme.css").write_text("body { background: url('img/local.png'); }")
    return tmp_path


def test_a_good_site_passes(site):
    report = check_book(site)
    assert report.ok, report.summary()
    assert report.pages == len(BOOK_PAGES) + len(STUDIES)
    assert report.links > len(STUDIES)


def test_missing_study_page_and_wrong_table(site):
    (site / STUDIES[2].html_path).unlink()
    (site / LANDING).write_text(page(table(CLAIMS[:21])))
    problems = "\n".join(check_book(site).problems)
    assert f"page missing: {STUDIES[2].html_path}" in problems
    assert f"{LANDING}: findings table rows" in problems


def test_remote_assets_are_caught_but_links_out_are_fine(site):
    (site / "book" / "engine.html").write_text(
        page(
            "<img src='https://example.org/a.png'><a href='https://example.org'>a link out is fine</a>",
            head="<link rel='stylesheet' href='//cdn.example.org/x.css'><script src='https://cdn.example.org/m.js'>"
            "</script><style>@import url(https://fonts.example.org/f.css);</style>",
        )
    )
    (site / "_static" / "theme.css").write_text("@font-face { src: url(https://fonts.example.org/f.woff2); }")
    problems = "\n".join(check_book(site).problems)
    for url in (
        "https://example.org/a.png",
        "//cdn.example.org/x.css",
        "https://cdn.example.org/m.js",
        "https://fonts.example.org/f.css",
        "https://fonts.example.org/f.woff2",
    ):
        assert f"loads {url} from the network" in problems
    assert "https://example.org'" not in problems and "loads https://example.org from" not in problems


def test_broken_internal_links_and_anchors(site):
    (site / "book" / "findings.html").write_text(
        page(
            table(CLAIMS[:3]) + table(CLAIMS[3:]) + "<a href='studies/02_gpu_costs.html#nope'>a</a>"
            "<a href='studies/99_none.html'>b</a><a href='#here'>c</a><span id='here'></span>"
            "<a href='../genindex.html'>index</a>"
        )
    )
    problems = check_book(site).problems
    assert "book/findings.html: link to missing anchor book/studies/02_gpu_costs.html#nope" in problems
    assert any("link to missing book/studies/99_none.html" in p for p in problems)
    assert len(problems) == 2, problems


def test_myst_shown_as_code_is_not_a_problem(site):
    (site / STUDIES[4].html_path).write_text(
        page(
            "<div class='cell_input'><pre>takeaway(':::{admonition} x')</pre></div>"
            "<p>Write <code class='docutils literal'>:::{admonition}</code> like this:</p>"
            "<div class='highlight-markdown'><pre>:::{admonition} Title</pre></div>"
        )
    )
    assert check_book(site).ok, check_book(site).problems
    (site / STUDIES[4].html_path).write_text(
        page(
            "<div class='cell_output'><div class='output text_plain highlight-myst-ansi'><pre>':::{admonition} F5.1'"
            "</pre></div></div>"
        )
    )
    assert "unrendered MyST" in "\n".join(check_book(site).problems)


def test_unrendered_myst_and_missing_mathjax(site):
    (site / STUDIES[4].html_path).write_text(page("<p>:::{admonition} F5.1 :class: tip</p>"))
    (site / "_static" / "mathjax" / "tex-chtml.js").unlink()
    problems = "\n".join(check_book(site).problems)
    assert "unrendered MyST" in problems and "MathJax is not served locally" in problems


def test_not_a_book(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == 1
    assert "is " in capsys.readouterr().err and "a built book" in check_book(tmp_path).problems[0]


def test_remote_resources_reads_the_tags_that_fetch():
    soup = BeautifulSoup(
        "<link rel='canonical' href='https://x.org/'><link rel='icon' href='https://x.org/i.png'>"
        "<iframe src='http://x.org/f'></iframe><script>var u='https://x.org'</script>",
        "html.parser",
    )
    assert remote_resources(soup) == ["http://x.org/f", "https://x.org/i.png"]


def test_an_executed_study_page_without_figures_or_findings_is_a_warning(site):
    (site / "_sources" / "book" / "studies").mkdir(parents=True)
    (site / "_sources" / "book" / "studies" / "02_gpu_costs.ipynb").write_text("{}")
    report = check_book(site)
    assert report.ok and len(report.warnings) == 3, report.warnings
    assert "02_gpu_costs.html: executed notebook with no figure" in report.warnings[0]
    assert "02_gpu_costs.html: no section titled 'Findings…'" in report.warnings[1]
    assert report.warnings[2].endswith("lacks a section on Findings, Seed vs H200, Limitations, How to re-run")
    assert "warning: book/studies/02_gpu_costs.html" in report.summary()
    (site / "book/studies/02_gpu_costs.html").write_text(
        page(
            "<h1 id='claim-f2-1'>Study 2</h1><img src='a.png'><section id='findings'><h2>Findings</h2></section>"
            "<h2>Seed vs H200, and limitations</h2><h2>Re-run this study</h2>"
        )
    )
    (site / "book/studies/a.png").write_bytes(b"png")
    assert not check_book(site).warnings


def test_cli_check_passes_a_good_site(site, capsys):
    assert main(["check", str(site)]) == 0
    assert "all good" in capsys.readouterr().out
