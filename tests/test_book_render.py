"""The book's configuration renders what the notebooks print: a takeaway box in an executed notebook's
output becomes a real admonition (with its math), not MyST source shown as text.

Builds a two-page book in a temporary directory with the repository's own ``_config.yml``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup

from servelab.errors import ParameterError
from servelab.paths import REPO_ROOT
from servelab_book.render import render_all
from servelab_book.takeaway import takeaway

JB = Path(sys.executable).with_name("jupyter-book")


@pytest.mark.skipif(not JB.exists(), reason="jupyter-book is not installed in this environment")
def test_takeaway_output_renders_as_an_admonition(tmp_path, monkeypatch):
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    box = takeaway("F5.1", "SDPA is **12.3×** faster than naive at $L = 2048$ tokens.")
    shutil.copy(REPO_ROOT / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "book" / "studies").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    shutil.copytree(
        REPO_ROOT / "book" / "_static", tmp_path / "book" / "_static", ignore=shutil.ignore_patterns("mathjax")
    )
    shutil.copytree(REPO_ROOT / "book" / "_extra", tmp_path / "book" / "_extra")  # the site root's files
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/studies/05_x\n")
    (tmp_path / "book" / "intro.md").write_text(
        "# Intro\n\nSee [the findings](project:/book/studies/05_x.ipynb#findings).\n"
    )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Study 5: x\n\n## Findings"),
        nbformat.v4.new_code_cell(
            "takeaway(...)",
            execution_count=1,
            outputs=[
                nbformat.v4.new_output(
                    "display_data", data={"text/markdown": box, "text/plain": "<IPython.core.display.Markdown object>"}
                )
            ],
        ),
    ]
    nbformat.write(nb, tmp_path / "book" / "studies" / "05_x.ipynb")

    out = subprocess.run(
        [str(JB), "build", str(tmp_path), "--builder", "html", "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    html = tmp_path / "_build" / "html" / "book" / "studies" / "05_x.html"
    soup = BeautifulSoup(html.read_text(), "html.parser")
    boxes = soup.select("div.admonition.tip")
    assert len(boxes) == 1, "the takeaway did not render as an admonition"
    assert boxes[0].select_one(".admonition-title").get_text(strip=True) == "F5.1"
    assert boxes[0].find("strong").get_text() == "12.3×"
    assert boxes[0].select_one("span.math") is not None  # $...$ became math for MathJax
    assert ":::" not in soup.find("main").get_text()
    assert soup.find(id="findings") is not None  # the anchor the findings table links to
    assert 'src="../../_static/mathjax/tex-chtml.js"' in html.read_text()  # local MathJax, no CDN


def test_an_unknown_stem_is_refused_before_anything_renders(tmp_path):
    # ``render simulator`` rendered nothing and said nothing: the simulator page's notebook is ``08_simulator``
    with pytest.raises(ParameterError, match="no page's notebook is named simulator; the stems: 01_scheduling"):
        render_all(root=tmp_path, only=["simulator", "08_simulator"])
    assert not any(tmp_path.iterdir())
    run = subprocess.run(
        [sys.executable, "-m", "servelab_book", "render", "simulator"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "08_simulator" in run.stderr and "rendered" not in run.stdout
