"""What an executed page's cell outputs may not hold, and what its figures must be.

Outputs: no warning (``UserWarning: …``, tqdm's ``TqdmWarning``), no progress bar, no traceback, no file path
(a ``.snap`` export, ``/tmp/…``, a home or site-packages path). They are silenced at the source; this is the check
that fails when one gets through. Only outputs are read: prose and code inputs may name a path on purpose.

Figures: SVG, or a PNG with at least twice the pixels of its displayed width ("retina": ``figure_formats``
``retina`` stores the PNG at 2× and displays it at half). A 1× PNG is blurred on every modern screen and its
type unreadable at page width.
"""

from __future__ import annotations

import base64
import re
import struct
from pathlib import Path
from urllib.parse import unquote

from bs4 import BeautifulSoup, Tag

OUTPUT = ".cell_output"
# each kind of output a page must not show, with a pattern that finds it in an output's text
FORBIDDEN = {
    "a warning": re.compile(r"\b[A-Z]\w*Warning\b:|\bwarnings\.warn\("),
    "a progress bar": re.compile(r"\d+%\|[^|\n]*\||\d+/\d+ \[\d+:\d+(?::\d+)?<|\d(?:\.\d+)? ?(?:it|s)/(?:s|it)\]"),
    "a traceback": re.compile(r"Traceback \(most recent call last\)|^\w*Error: ", re.MULTILINE),
    "a file path": re.compile(
        r"[\w./-]*\.snap\b|(?<![\w.:/])/(?:tmp|home|root|work|var|mnt|scratch|opt|usr|srv)/[\w.@+-][\w./@+-]*"
        r"|site-packages/"
    ),
}
ERROR_CLASSES = ("traceback", "error")  # myst-nb's classes for an error output
RETINA = 1.9  # pixels per displayed pixel that count as retina (2× less rounding)
_STYLE_WIDTH = re.compile(r"(?:^|;)\s*width:\s*([\d.]+)px", re.IGNORECASE)


def output_problems(soup: BeautifulSoup) -> list[str]:
    """Every forbidden thing in the page's cell outputs, one line each with what was found."""
    found = []
    for i, out in enumerate(soup.select(OUTPUT)):
        text = out.get_text("\n")
        for kind, pattern in FORBIDDEN.items():
            m = pattern.search(text)
            if m:
                found.append(f"output {i + 1} shows {kind}: {m.group(0).strip()[:80]!r}")
        if any(c in ERROR_CLASSES for el in out.find_all(class_=True) for c in el.get("class", [])):
            found.append(f"output {i + 1} shows a traceback (an error output)")
    return sorted(set(found), key=found.index)


def png_width(data: bytes) -> int | None:
    """A PNG's width in pixels from its header; None if ``data`` is not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">I", data[16:20])[0]


def displayed_width(img: Tag) -> float | None:
    """The width the page displays an image at, in CSS pixels (``width`` attribute or style); None if unset."""
    m = _STYLE_WIDTH.search(img.get("style", ""))
    if m:
        return float(m.group(1))
    width = str(img.get("width", "")).removesuffix("px")
    return float(width) if re.fullmatch(r"[\d.]+", width) else None


def _image_bytes(src: str, page: Path) -> bytes | None:
    if src.startswith("data:"):
        head, _, payload = src.partition(",")
        return base64.b64decode(payload) if head.endswith(";base64") else None
    path = (page.parent / unquote(src.split("#")[0].split("?")[0])).resolve()
    return path.read_bytes() if path.is_file() else None


def figure_problems(soup: BeautifulSoup, page: Path) -> list[str]:
    """Every figure in the page's cell outputs that is neither SVG nor a retina PNG (``page``: the HTML file,
    to find the images it links)."""
    found = []
    for img in soup.select(f"{OUTPUT} img"):
        src = img.get("src", "")
        if src.startswith("data:image/svg") or src.split("?")[0].endswith(".svg"):
            continue
        name = "(inline)" if src.startswith("data:") else src
        data = _image_bytes(src, page)
        pixels = png_width(data) if data else None
        shown = displayed_width(img)
        if pixels is None:
            found.append(f"figure {name} is neither SVG nor a PNG that can be read")
        elif shown is None or pixels < RETINA * shown:
            at = f"shown at {shown:g} px" if shown else "shown at its own size"
            found.append(f"figure {name} is a 1× PNG ({pixels} px wide, {at}): render it as SVG or retina")
    return found
