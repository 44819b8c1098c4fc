"""The rendered pages as a reader gets them: every committed study page (``book/studies/*.ipynb``) and the simulator
page (``book/simulator.ipynb``) checked cell by cell, from the files alone.

- rendered from the committed data: papermill ran the page with ``profile="replay"`` (``python -m servelab_book
  render``); whether the page equals a fresh render is ``make test-pages`` (nbval);
- findings first: ``## Findings`` is the first section, within the first quarter of what the page shows, after the
  evidence banner (``studies.common.page.evidence_banner``: what the data is, fresh or stale);
- code hidden: every code cell is tagged ``remove-input`` or ``remove-cell`` (papermill's injected parameters are
  hidden by the book's reader); never ``hide-input``;
- clean outputs: no stream output (stdout or stderr), no error, no warning, progress bar or file path, no table of
  more than a dozen rows;
- sharp figures: SVG, or a PNG stored at ≥ 2× its displayed width; each followed by its caption;
- the sections of a study page, in order, with "Against published results" showing its table.

These fail on a page rendered by the old layout (a GPU execution with visible code): re-render it.
"""

from __future__ import annotations

import base64
import re

import nbformat
import pytest

from servelab.paths import REPO_ROOT
from servelab_book.output_checks import FORBIDDEN, RETINA, png_width
from servelab_book.studies import STUDIES

STUDY_PAGES = [f"book/studies/{s.slug}.ipynb" for s in STUDIES]
PAGES = STUDY_PAGES + ["book/simulator.ipynb"]
HIDDEN = {"remove-input", "remove-cell"}
INJECTED = "injected-parameters"
SECTIONS = ["Findings", "Method", "Limitations", "Against published results", "Re-run this study"]
MAX_ROWS = 12
FINDINGS_WITHIN = 0.25


def _read(page: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO_ROOT / page, as_version=4)


def _tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def shown_blocks(nb) -> list[tuple[str, object]]:
    """What the page shows, in order: ("md", source) for a markdown cell, ("out", output) for each output of a code
    cell whose output is shown (not ``remove-cell``, not papermill's injected parameters)."""
    blocks = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            blocks.append(("md", cell.source))
        elif cell.cell_type == "code" and not (_tags(cell) & {"remove-cell", INJECTED, "remove-output"}):
            blocks += [("out", o) for o in cell.get("outputs", [])]
    return blocks


def _text(out) -> str:
    if out.get("output_type") == "stream":
        return out.get("text", "")
    data = out.get("data", {})
    return "\n".join(str(data[k]) for k in ("text/markdown", "text/html", "text/plain") if k in data)


def headings(nb) -> list[str]:
    return [m for c in nb.cells if c.cell_type == "markdown" for m in re.findall(r"(?m)^## +(.+?)\s*$", c.source)]


def code_problems(nb) -> list[str]:
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = _tags(cell)
        if "hide-input" in tags:
            found.append(f"cell {i}: hide-input shows a fold of code; use remove-input")
        if not (tags & HIDDEN) and INJECTED not in tags:
            found.append(f"cell {i}: its code is shown (tag it remove-input or remove-cell)")
    return found


def output_problems(nb) -> list[str]:
    found = []
    for kind, out in shown_blocks(nb):
        if kind != "out":
            continue
        t = out.get("output_type")
        if t == "stream":
            found.append(f"a {out.get('name')} stream: {out.get('text', '')[:80]!r}")
            continue
        if t == "error":
            found.append(f"an error: {out.get('ename')}: {out.get('evalue', '')[:80]}")
            continue
        text = _text(out)
        for what, pattern in FORBIDDEN.items():
            m = pattern.search(text)
            if m:
                found.append(f"{what}: {m.group(0).strip()[:80]!r}")
        html = str(out.get("data", {}).get("text/html", ""))
        rows = len(re.findall(r"<tr\b", html.split("<tbody>", 1)[-1]))
        if rows > MAX_ROWS:
            found.append(f"a table of {rows} rows (show a compact view; the full table is the CSV)")
        if t == "execute_result" and set(out.get("data", {})) == {"text/plain"}:
            found.append(f"a raw value: {text[:80]!r}")
    return found


def figure_problems(nb) -> list[str]:
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _tags(cell) & {"remove-cell", INJECTED}:
            continue
        outs = cell.get("outputs", [])
        for k, out in enumerate(outs):
            data = out.get("data", {})
            if "image/svg+xml" not in data and "image/png" not in data:
                continue
            if "image/png" in data and "image/svg+xml" not in data:
                pixels = png_width(base64.b64decode(data["image/png"]))
                shown = (out.get("metadata", {}).get("image/png") or {}).get("width")
                if pixels is None or not shown or pixels < RETINA * float(shown):
                    found.append(f"cell {i}: a 1× PNG ({pixels} px shown at {shown or 'its own size'}); use SVG")
            nxt = outs[k + 1] if k + 1 < len(outs) else None
            caption = (nxt or {}).get("data", {}).get("text/markdown", "") if nxt else ""
            if not str(caption).strip().startswith(("*", "_", "Figure")):
                found.append(f"cell {i}: a figure without a caption after it (show(fig, '*caption*'))")
    return found


def findings_position(nb) -> float | None:
    """Where ``## Findings`` starts, as a fraction of the blocks the page shows (None: no such heading)."""
    blocks = shown_blocks(nb)
    for i, (kind, body) in enumerate(blocks):
        if kind == "md" and re.search(r"(?m)^## +Findings\b", body):
            return i / len(blocks)
    return None


# ---- the checks, on every committed page -----------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_the_page_is_a_replay_render_of_its_notebook(page):
    nb = _read(page)
    params = (nb.metadata.get("papermill") or {}).get("parameters", {})
    assert params.get("profile") == "replay", f"{page}: not rendered from the data (python -m servelab_book render)"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{page}: the title comes first"


@pytest.mark.parametrize("page", PAGES)
def test_code_is_hidden(page):
    assert code_problems(_read(page)) == []


@pytest.mark.parametrize("page", PAGES)
def test_outputs_are_clean(page):
    assert output_problems(_read(page)) == []


@pytest.mark.parametrize("page", PAGES)
def test_figures_are_sharp_and_captioned(page):
    assert figure_problems(_read(page)) == []


@pytest.mark.parametrize("page", STUDY_PAGES)
def test_findings_come_first_after_the_evidence_banner(page):
    nb = _read(page)
    assert headings(nb)[:1] == ["Findings"], headings(nb)
    at = findings_position(nb)
    assert at is not None and at < FINDINGS_WITHIN, f"{page}: ## Findings at {at:.0%} of the page"
    before = [b for k, b in shown_blocks(nb)[: int(at * len(shown_blocks(nb)))] if k == "out"]
    assert any(re.search(r"Measured on|Not measured", _text(o)) for o in before), f"{page}: no evidence banner"


@pytest.mark.parametrize("page", STUDY_PAGES)
def test_a_study_page_has_its_sections_in_order_and_a_published_comparison(page):
    nb = _read(page)
    got = [h.split(":")[0] for h in headings(nb) if h.split(":")[0] in SECTIONS]  # "Method: the paged KV cache"
    assert got == SECTIONS, f"{page}: sections {headings(nb)}"
    blocks = shown_blocks(nb)
    i = next(i for i, (k, b) in enumerate(blocks) if k == "md" and "## Against published results" in b)
    shown = _text(blocks[i + 1][1]) if i + 1 < len(blocks) and blocks[i + 1][0] == "out" else ""
    assert "list-table" in shown or "No published number" in shown, f"{page}: no published table"


# ---- the checks can fail ---------------------------------------------------------------------------------------


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return nb


def _code(tags, outputs=()):
    c = nbformat.v4.new_code_cell("x", metadata={"tags": list(tags)})
    c.outputs = list(outputs)
    return c


def _md_out(text):
    return nbformat.v4.new_output("display_data", data={"text/markdown": text, "text/plain": "<Markdown>"})


def test_the_checks_catch_what_the_old_pages_showed():
    png_1x = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (400).to_bytes(4, "big") + b"\0" * 8).decode()
    bad = _nb(
        [
            nbformat.v4.new_markdown_cell("# Study 9\n\nThe question."),
            _code([], [nbformat.v4.new_output("stream", name="stderr", text="TqdmWarning: IProgress not found")]),
            _code(["hide-input"], [_md_out("see /work/main/.snap/data/results/x.csv")]),
            _code(["remove-input"], [nbformat.v4.new_output("display_data", data={"image/png": png_1x})]),
            _code(["remove-input"], [nbformat.v4.new_output("display_data", data={"text/html": "<tr>" * 20})]),
            nbformat.v4.new_markdown_cell("## Method\n\n" + "words " * 10),
            *[nbformat.v4.new_markdown_cell("more") for _ in range(5)],
            nbformat.v4.new_markdown_cell("## Findings"),
        ]
    )
    assert code_problems(bad) == [
        "cell 1: its code is shown (tag it remove-input or remove-cell)",
        "cell 2: hide-input shows a fold of code; use remove-input",
        "cell 2: its code is shown (tag it remove-input or remove-cell)",
    ]
    said = " | ".join(output_problems(bad))
    assert "stderr stream" in said and "a file path" in said and "20 rows" in said
    assert any("1× PNG" in p for p in figure_problems(bad)) and any("caption" in p for p in figure_problems(bad))
    assert findings_position(bad) > FINDINGS_WITHIN and headings(bad)[0] == "Method"
    good = _nb(
        [
            nbformat.v4.new_markdown_cell("# Study 9"),
            _code(["parameters", "remove-cell"]),
            _code(["remove-input"], [_md_out("Measured on NVIDIA H200: 3 repeats.")]),
            nbformat.v4.new_markdown_cell("## Findings"),
            _code(
                ["remove-input"],
                [nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg/>"}), _md_out("*caption*")],
            ),
            nbformat.v4.new_markdown_cell("## Method"),
        ]
        + [nbformat.v4.new_markdown_cell("text") for _ in range(6)]
    )
    assert code_problems(good) == output_problems(good) == figure_problems(good) == []
    assert findings_position(good) < FINDINGS_WITHIN
