"""Pieces of the book computed from data: takeaway boxes in notebooks, the findings table, build checks."""

from servelab.book.takeaway import takeaway

__all__ = ["takeaway"]
