"""Where a claim's row in the findings table links to: the claim's section on its study page.

- A placeholder page carries one labelled section per claim (label ``claim-f2-1``, from the generated
  seed-claims include), so the link lands on the claim itself.
- An executed notebook links to its "Findings" heading (the study-page structure in the methodology
  asks for one), found in the notebook's markdown cells; without one, to the page's top.

Links are written as MyST ``project:`` links, so Sphinx resolves them and the ``-W`` build fails on a
broken one.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import nbformat

from servelab_book.seed_claims import claim_anchor
from servelab_book.studies import StudyPage

HEADING = re.compile(r"^(#{1,3})\s+(.+?)\s*#*\s*$")
FINDINGS_HEADING = re.compile(r"^findings\b", re.IGNORECASE)


def slugify(title: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``); GitHub-style."""
    from myst_parser.mdit_to_docutils.base import default_slugify

    return default_slugify(title)


def findings_anchor(page: StudyPage) -> str | None:
    """The anchor of the first level-1..3 heading starting with "Findings" in an executed notebook."""
    return _findings_anchor(page.source, page.source.stat().st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _findings_anchor(path: Path, mtime_ns: int) -> str | None:  # mtime_ns: re-read an edited notebook
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        in_fence = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith(("```", "~~~", ":::")):
                in_fence = not in_fence
            m = None if in_fence else HEADING.match(line)
            if m and FINDINGS_HEADING.match(m.group(2)):
                return slugify(m.group(2))
    return None


def claim_target(page: StudyPage, claim_id: str) -> str:
    """A ``project:`` link target for one claim on its study's page."""
    if not page.measured:  # a label, global to the book (MyST resolves `#label` across documents)
        return f"project:#{claim_anchor(claim_id)}"
    doc = f"project:/{page.study.docname}{page.source.suffix}"
    anchor = findings_anchor(page)
    return f"{doc}#{anchor}" if anchor else doc
