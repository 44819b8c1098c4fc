"""MathJax 3, served from the book itself so that math renders without a network.

The files come from the ``sphinx-mathjax-offline`` package (MathJax 3.2.2, pinned in requirements.txt);
``prepare`` copies the parts the book uses into ``book/_static/mathjax/`` (not committed), and
``_config.yml`` points ``mathjax_path`` at ``mathjax/tex-chtml.js``.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

from servelab_book.studies import BOOK_DIR

DISTRIBUTION = "sphinx-mathjax-offline"
ENTRY = "tex-chtml.js"
# tex-chtml.js and what it loads at run time: TeX extensions on demand, CHTML fonts, the menu's
# accessibility and speech components; the other combined bundles (svg, mml) are not needed.
PARTS = (ENTRY, "input/tex", "output/chtml", "ui", "a11y", "adaptors", "sre")
TARGET = BOOK_DIR / "_static" / "mathjax"


class MathJaxMissing(RuntimeError):
    """The MathJax package is not installed."""


def mathjax_source() -> Path:
    """The MathJax folder inside the installed package."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise MathJaxMissing(
            f"{DISTRIBUTION} is not installed; it ships the book's offline MathJax: pip install -r requirements.txt"
        ) from None
    src = Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))
    if not (src / ENTRY).is_file():
        raise MathJaxMissing(f"{src / ENTRY} not found in the installed {DISTRIBUTION} {dist.version}")
    return src


def vendor_mathjax(target: Path = TARGET, source: Path | None = None) -> Path:
    """Copy MathJax into ``target`` afresh (so removed files do not linger); returns the entry script."""
    source = source or mathjax_source()
    if target.exists():
        shutil.rmtree(target)
    for part in PARTS:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, target / part)
        elif src.is_file():
            (target / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / part)
        else:
            raise MathJaxMissing(f"MathJax part {part} not found in {source}")
    return target / ENTRY
