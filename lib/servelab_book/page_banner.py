"""The note at the top of every executed page: the commit its run came from, and a banner where the code the
page depends on has changed since (``staleness.page_status``).

``prepare`` writes the notes to ``book/_generated/page_runs.json``; the notebook reader puts each one under its
page's title at build time, so the executed notebooks themselves are never edited. The CSS classes let the
book check and the browser test find them: ``servelab-run`` (current), ``servelab-stale``, ``servelab-run-unknown``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from servelab_book.staleness import PageStatus

RUNS_FILE = "page_runs.json"
CLASSES = {"current": "servelab-run", "stale": "servelab-stale", "unknown": "servelab-run-unknown"}
SHOWN_GROUPS = 6  # the banner names this many folders, then counts the rest


def _group(path: str) -> str:
    """The folder a changed file is counted under: a package of lib/ (``lib/servelab/engine/``), or the file."""
    parts = path.split("/")
    if parts[0] == "lib" and len(parts) > 3:
        depth = 4 if parts[2] == "studies" and len(parts) > 4 else 3
        return "/".join(parts[:depth]) + "/"
    return path


def changed_summary(changed: tuple[str, ...]) -> str:
    """ "`notebooks/01_scheduling.ipynb`, `lib/servelab/engine/` (12 files), …" with the largest groups first."""
    groups = Counter(_group(p) for p in changed)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0].startswith("lib/"), -kv[1], kv[0]))
    shown = [f"`{g}`" + (f" ({n} files)" if n > 1 else "") for g, n in ordered[:SHOWN_GROUPS]]
    rest = len(ordered) - SHOWN_GROUPS
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


def render_banner(status: PageStatus) -> str:
    """The MyST note for one page."""
    commit = f"`{status.commit[:7]}`" if status.commit else "an unrecorded commit"
    head = f"This page is the H200 run at commit {commit}."
    if status.status == "current":
        kind, body = "note", f"{head} The code it depends on has not changed since."
    elif status.status == "stale":
        behind = f", over {status.behind} commits" if status.behind else ""
        kind, body = (
            "warning",
            f"{head} The code it depends on has changed since ({len(status.changed)} files{behind}): "
            f"{changed_summary(status.changed)}. Its numbers and text are that run's, not today's code's.",
        )
    else:
        kind, body = "note", f"{head} Whether its code changed since could not be checked: {status.reason}."
    return f":::{{{kind}}}\n:class: {CLASSES[status.status]}\n{body}\n:::\n"


def render_runs_file(statuses: list[PageStatus]) -> str:
    """``page_runs.json``: for each executed page, its run's commit, status and the note to show."""
    data = {s.page: {**s.as_dict(), "banner": render_banner(s)} for s in statuses}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def load_banner(page: str, generated_dir: Path) -> str | None:
    """The note for ``page`` (e.g. ``book/studies/01_scheduling.ipynb``), None where prepare wrote none."""
    path = Path(generated_dir) / RUNS_FILE
    if not path.is_file():
        return None
    entry = json.loads(path.read_text(encoding="utf-8")).get(page)
    return entry["banner"] if entry else None
