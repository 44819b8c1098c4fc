"""Pieces of the book computed from data: takeaway boxes in notebooks, the findings table, build checks."""

from servelab_book.takeaway import takeaway

__all__ = ["takeaway"]
