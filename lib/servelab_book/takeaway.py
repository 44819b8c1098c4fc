"""Takeaway boxes whose numbers are computed, not typed.

A notebook calls ``takeaway("F2.1", text)`` with text formatted from its data; the output is MyST
markdown (an admonition), which the book renders as a box (``nb_render_markdown_format: myst``).
"""

from __future__ import annotations


class TakeawayMarkdown(str):
    """The box's markdown; a cell ending in ``takeaway(...)`` then shows no ``Out[]`` echo of it."""

    def _ipython_display_(self):
        pass


def takeaway(title: str, text: str, kind: str = "tip") -> TakeawayMarkdown:
    """Display a takeaway admonition; returns the markdown string too (for tests)."""
    from IPython.display import Markdown, display

    md = f":::{{admonition}} {title}\n:class: {kind}\n{text.strip()}\n:::\n"
    display(Markdown(md))
    return TakeawayMarkdown(md)
