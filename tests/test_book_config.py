"""The book's configuration: what issue #2 and #10 require of `_config.yml` and `_toc.yml`."""

from __future__ import annotations

import yaml

from servelab.paths import REPO_ROOT
from servelab_book.check import BOOK_PAGES
from servelab_book.studies import STUDIES

CONFIG = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())


def toc_files(toc: dict) -> list[str]:
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def test_toc_lists_intro_methodology_the_seven_studies_and_findings():
    files = toc_files(TOC)
    assert files[0] == "book/intro"
    assert set(files) == set(BOOK_PAGES) | {s.docname for s in STUDIES}
    studies = [f for f in files if f.startswith("book/studies/")]
    assert studies == [s.docname for s in STUDIES]  # in the seed's order
    for f in files:  # every listed page has a source (studies: placeholder or executed notebook)
        assert any((REPO_ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb")), f


def test_config_renders_executed_notebooks_offline_and_strictly():
    assert CONFIG["execute"]["execute_notebooks"] == "off"
    assert CONFIG["only_build_toc_files"] is True
    for excluded in ("lib", "notebooks", "tests", "data", ".venv", "README.md"):
        assert excluded in CONFIG["exclude_patterns"]
    assert {"colon_fence", "dollarmath", "amsmath"} <= set(CONFIG["parse"]["myst_enable_extensions"])
    sphinx = CONFIG["sphinx"]["config"]
    assert sphinx["nb_render_markdown_format"] == "myst"  # takeaway boxes are MyST admonitions
    assert sphinx["mathjax_path"] == "mathjax/tex-chtml.js"  # local, copied by `prepare`
    assert "sphinx_thebe" not in sphinx["extensions"]
    assert CONFIG["launch_buttons"]["thebe"] is False and not CONFIG["launch_buttons"]["binderhub_url"]
    assert CONFIG["bibtex_bibfiles"] == ["book/references.bib"]


def test_bibliography_has_every_work_the_issue_names():
    bib = (REPO_ROOT / "book" / "references.bib").read_text()
    for key in (
        "yu2022orca",
        "kwon2023vllm",
        "agrawal2024sarathi",
        "agrawal2024vidur",
        "leviathan2023speculative",
        "chen2023speculative",
        "dao2024flashattention2",
        "shah2024flashattention3",
        "dong2024flexattention",
        "zheng2024sglang",
        "williams2009roofline",
    ):
        assert f"{{{key}," in bib
        cited = any(key in p.read_text() for p in (REPO_ROOT / "book").rglob("*.md"))
        assert cited, f"{key} is never cited"


def test_the_sidebar_puts_the_findings_first_and_the_engine_and_simulator_beside_their_studies():
    files = toc_files(TOC)
    assert TOC["parts"][0]["chapters"][0]["file"] == "book/findings"  # the first entry after the landing page
    at = {f: i for i, f in enumerate(files)}
    # the simulator replays Study 1's schedulers on Study 2's costs: between them; the engine beside Study 2
    assert at["book/studies/01_scheduling"] < at["book/simulator"] < at["book/studies/02_gpu_costs"]
    assert at["book/engine"] == at["book/studies/02_gpu_costs"] + 1
