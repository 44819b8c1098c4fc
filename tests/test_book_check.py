"""`servelab_book check` on small hand-made sites: each problem it exists to catch is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from servelab.studies.common.markdown import TABLE_CLASS
from servelab_book.__main__ import main
from servelab_book.check import BOOK_PAGES, FINDINGS, LANDING, check_book, remote_resources
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


BANNER = "<p>Measured on NVIDIA H200: 3 repeats (3 runs, fingerprint `abc`). The measuring code is today's.</p>"
FINDINGS_FIRST = f"<h1>Study</h1>{BANNER}<section id='findings'><h2>Findings</h2><p>the verdicts</p></section>"
REST = (
    "<h2>Method</h2><p>" + "how it was measured " * 40 + "</p><h2>Limitations</h2>"
    "<section id='against-published-results'><h2>Against published results</h2>"
    "<table class='servelab-published'><tr><td>x</td></tr></table></section><h2>Re-run this study</h2>"
)
RUN_NOTE = FINDINGS_FIRST  # what a rendered page shows first: its evidence banner and its findings


def png(width: int) -> bytes:
    """The first bytes of a PNG ``width`` pixels wide: enough for its header."""
    return b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + width.to_bytes(4, "big") + (300).to_bytes(4, "big")


def executed(site: Path, docname: str, body: str) -> Path:
    """Make ``docname`` an executed page (its notebook source exists) with ``body``."""
    (site / "_sources" / docname).parent.mkdir(parents=True, exist_ok=True)
    (site / "_sources" / f"{docname}.ipynb").write_text("{}")
    (site / f"{docname}.html").write_text(page(body + (REST if docname.startswith("book/studies/") else "")))
    return site / f"{docname}.html"


def test_a_study_page_without_a_figure_is_a_warning(site):
    executed(site, "book/studies/02_gpu_costs", FINDINGS_FIRST)
    report = check_book(site)
    assert report.ok and report.warnings == ["book/studies/02_gpu_costs.html: a study page with no figure"]
    executed(site, "book/studies/02_gpu_costs", f"{FINDINGS_FIRST}<div class='cell_output'><img src='a.svg'></div>")
    assert not check_book(site).warnings and check_book(site).ok


def test_the_book_reader_checks_fail_the_old_layout(site):
    """Findings 80% of the way down, code shown, no banner, no published section: each is a problem."""
    old = (
        "<h1 id='claim-f1-1'>Study 1</h1><div class='cell_input'><pre>import x</pre></div>"
        + "<p>"
        + "a long run log " * 200
        + "</p><section id='findings'><h2>Findings</h2></section>"
    )
    (site / "_sources" / "book" / "studies").mkdir(parents=True, exist_ok=True)
    (site / "_sources" / "book" / "studies" / "01_scheduling.ipynb").write_text("{}")
    (site / "book" / "studies" / "01_scheduling.html").write_text(page(old))
    problems = [p.split(": ", 1)[1] for p in check_book(site).problems]
    assert problems[0] == "no evidence banner (what its data is, fresh or stale)"
    assert problems[1] == "1 code cell(s) shown (tag them remove-input or remove-cell)"
    assert problems[2].startswith("'Findings' starts 100%") and problems[2].endswith("(must be < 25%)")
    assert problems[3] == "no 'Against published results' section with its table"


def test_the_simulator_page_needs_its_banner_and_hidden_code(site):
    executed(site, "book/simulator", "<h1>Simulator</h1>")
    assert check_book(site).problems == ["book/simulator.html: no evidence banner (what its data is, fresh or stale)"]
    executed(site, "book/simulator", f"<h1>Simulator</h1>{BANNER}")
    assert check_book(site).ok


@pytest.mark.parametrize(
    "output, kind",
    [
        ("<pre>/usr/lib/python3/dist-packages/tqdm/std.py:580: TqdmWarning: clamping frac</pre>", "a warning"),
        ("<pre>UserWarning: profiler ran twice</pre>", "a warning"),
        ("<pre>sweep:  45%|████▌     | 9/20 [00:03&lt;00:04,  2.61it/s]</pre>", "a progress bar"),
        ("<pre>100%|##########| 20/20</pre>", "a progress bar"),
        ("<pre>Traceback (most recent call last):\n  File x</pre>", "a traceback"),
        ("<pre>wrote .snap/data/results/nvidia-h200/01_scheduling/steps.csv</pre>", "a file path"),
        ("<pre>saved to /tmp/tmpab12/run.csv</pre>", "a file path"),
        ("<pre>/root/.cache/site-packages/x.py</pre>", "a file path"),
    ],
)
def test_outputs_with_warnings_bars_tracebacks_or_paths_fail(site, output, kind):
    executed(site, "book/studies/03_speculative", f"{RUN_NOTE}<div class='cell_output'>{output}</div>")
    problems = check_book(site).problems
    assert problems and problems[0].startswith(f"book/studies/03_speculative.html: output 1 shows {kind}")
    assert all(p.startswith("book/studies/03_speculative.html: output 1 shows ") for p in problems)


def test_clean_outputs_and_prose_naming_a_path_pass(site):
    executed(
        site,
        "book/studies/03_speculative",
        f"{RUN_NOTE}<p>Results go to /tmp/x on a CPU.</p>"
        "<div class='cell_output'><pre>median 12.3 ms over 20 runs; 45% of the floor | 1.2 it per step</pre></div>",
    )
    assert check_book(site).ok, check_book(site).problems


def test_error_outputs_are_tracebacks(site):
    executed(
        site,
        "book/studies/03_speculative",
        f"{RUN_NOTE}<div class='cell_output'><div class='output traceback'><pre>boom</pre></div></div>",
    )
    assert "shows a traceback (an error output)" in check_book(site).problems[0]


def test_figures_must_be_svg_or_retina_png(site):
    d = site / "book" / "studies"
    (d / "one.png").write_bytes(png(800))
    (d / "two.png").write_bytes(png(1600))
    executed(
        site,
        "book/studies/04_kv_cache",
        f"{RUN_NOTE}<div class='cell_output'><img src='one.png' style='width: 800px; height: 300px;'></div>"
        "<div class='cell_output'><img src='two.png' style='width: 800px;'><img src='f.svg'></div>"
        "<div class='cell_output'><img src='three.png'></div>",
    )
    problems = check_book(site).problems
    assert problems == [
        "book/studies/04_kv_cache.html: figure one.png is a 1× PNG (800 px wide, shown at 800 px): "
        "render it as SVG or retina",
        "book/studies/04_kv_cache.html: figure three.png is neither SVG nor a PNG that can be read",
    ]
    executed(
        site, "book/studies/04_kv_cache", f"{RUN_NOTE}<div class='cell_output'><img src='two.png' width='800'></div>"
    )
    assert check_book(site).ok


def test_a_page_on_stale_data_is_held_to_the_same_layout(site):
    stale = "<p>Measured on NVIDIA H200: 1 repeat. Stale: measured by older code.</p>"
    executed(
        site,
        "book/studies/05_attention",
        f"<h1>S</h1>{stale}<section id='findings'><h2>Findings</h2></section>"
        "<div class='cell_output'><pre>UserWarning: x</pre></div>",
    )
    assert check_book(site).problems == ["book/studies/05_attention.html: output 1 shows a warning: 'UserWarning:'"]


def test_cli_check_passes_a_good_site(site, capsys):
    assert main(["check", str(site)]) == 0
    assert "all good" in capsys.readouterr().out
