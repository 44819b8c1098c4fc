"""How the book reads an executed notebook: as Jupyter shows it, with progress bars settled.

papermill stores every tqdm refresh as its own stream output (``\\r`` + the bar's new state), so a sweep
leaves hundreds of outputs that a static page would print one under the other. A notebook front end
applies the carriage returns and shows each bar once, in its final state; this reader does the same
before MyST-NB renders the page.

It also drops the echo of a takeaway box: ``takeaway()`` displays its box and returns the markdown, so a
cell that ends with the call also shows the box's MyST source as the cell's value (``Out[n]``). An
``execute_result`` whose plain text is exactly the repr of markdown displayed by the same cell goes.
And it hides the cell papermill injects with the run's
parameters (tagged ``injected-parameters``): a reader sees the notebook's ``parameters`` cell, and the run's values
are recorded in the study's ``run.json``; the injected cell is an artefact of how papermill ran it. It gets MyST-NB's
``remove-cell`` tag, in memory only. Nothing else in the notebook changes, and the file is not rewritten.

Registered for ``.ipynb`` in ``_config.yml`` (``nb_custom_formats``).
"""

from __future__ import annotations

import ast
import re

import nbformat

_NEWLINE = re.compile(r"\r*\n")


def settle_carriage_returns(text: str) -> str:
    """Terminal semantics for ``\\r``: each line keeps what was written after its last carriage return."""
    lines = _NEWLINE.split(text)
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line else line for line in lines)


def merge_streams(outputs: list) -> list:
    """Join consecutive stream outputs of the same stream (stdout or stderr), settling ``\\r`` in each run."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            out.get("output_type") == "stream"
            and prev is not None
            and prev.get("output_type") == "stream"
            and prev.get("name") == out.get("name")
        ):
            prev["text"] += out["text"]
        else:
            merged.append(out)
    for out in merged:
        if out.get("output_type") == "stream":
            out["text"] = settle_carriage_returns(out["text"])
    return [o for o in merged if o.get("output_type") != "stream" or o["text"].strip()]


def _as_string(plain: str) -> str | None:
    """The string a plain-text repr stands for (IPython may wrap a long one over lines), else None."""
    try:
        value = ast.literal_eval(plain)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def drop_markdown_echoes(outputs: list) -> list:
    """Remove ``execute_result``s that only repeat, as a string repr, markdown the cell displayed."""
    shown = {
        o["data"]["text/markdown"]
        for o in outputs
        if o.get("output_type") == "display_data" and isinstance(o.get("data", {}).get("text/markdown"), str)
    }
    return [
        o
        for o in outputs
        if not (
            o.get("output_type") == "execute_result"
            and set(o.get("data", {})) == {"text/plain"}
            and _as_string(o["data"]["text/plain"]) in shown
        )
    ]


INJECTED = "injected-parameters"  # papermill's tag on the cell it adds after ``parameters``
REMOVE = "remove-cell"  # MyST-NB leaves a cell with this tag out of the page, source and outputs


def hide_injected_parameters(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Tag papermill's injected-parameters cell ``remove-cell``, so the page does not show it."""
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if INJECTED in tags and REMOVE not in tags:
            cell.metadata["tags"] = [*tags, REMOVE]
    return nb


def read_notebook(text: str) -> nbformat.NotebookNode:
    """The MyST-NB reader for the book: parse the notebook, settle progress bars, drop takeaway echoes, hide
    papermill's injected parameters. (Whether a page's data is fresh is the page's own first output,
    ``studies.common.page.evidence_banner``.)"""
    nb = hide_injected_parameters(nbformat.reads(text, as_version=4))
    for cell in nb.cells:
        if cell.get("cell_type") == "code" and cell.get("outputs"):
            cell["outputs"] = drop_markdown_echoes(merge_streams(cell["outputs"]))
    return nb
