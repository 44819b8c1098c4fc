"""The first screen of a study page, built from the run's findings: the verdict table and the takeaway list.

A study notebook shows its verdicts before anything else (the question, the verdict table, three to five takeaway
sentences, the one figure), so these are markdown strings the notebook displays in one call each; every number in
them comes from the ``Finding`` records or tables the run computed, never from the notebook's cells.
"""

from __future__ import annotations

from collections.abc import Iterable

from servelab.studies.common.findings import Finding

SEED_DEVICE = "RTX 2070"  # the seed's GPU: every seed value in shared/seed-studies.md was measured on it


def md_cell(text) -> str:
    """``text`` safe inside a markdown table cell: pipes escaped, line breaks flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def verdict_table(findings: Iterable[Finding], device: str) -> str:
    """A markdown table, one row per claim: claim, the seed's value, this run's value and unit, verdict, tested on.

    ``device``: the GPU this run measured on (the column heading of the measured values).
    """
    head = f"| Claim | {SEED_DEVICE} (seed) | {md_cell(device)} | Unit | Verdict | Tested on |"
    rows = [head, "|---|---|---|---|---|---|"]
    for f in findings:
        rows.append(
            f"| **{f.id}** {md_cell(f.claim)} | {md_cell(f.seed_value) or '—'} | {md_cell(f.measured_value)} | "
            f"{md_cell(f.unit)} | **{f.verdict}** | {md_cell(f.tested_on) or '—'} |"
        )
    return "\n".join(rows) + "\n"


def takeaway_list(sentences: Iterable[str]) -> str:
    """The page's takeaways as a markdown bullet list; empty sentences (a part that did not run) are left out."""
    items = [s.strip() for s in sentences if s and s.strip()]
    return "".join(f"- {s}\n" for s in items)


def show(markdown: str) -> None:
    """Display markdown in a notebook (the book renders it as MyST); nothing if it is empty."""
    if not markdown.strip():
        return
    from IPython.display import Markdown, display

    display(Markdown(markdown))


def finding_sentence(f: Finding) -> str:
    """One takeaway per claim: ``**F2.1 changes.** <claim>: <this run's value> [unit].``

    The seed's value is in the verdict table beside it; the unit is added where the value is a bare number or range.
    """
    value = f.measured_value
    bare = value[:1].isdigit() and value[-1:].isdigit()
    unit = f" {f.unit}" if bare and f.unit else ""
    return f"**{f.id} {f.verdict}.** {f.claim[:1].upper()}{f.claim[1:]}: {value}{unit}."
