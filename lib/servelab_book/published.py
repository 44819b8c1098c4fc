"""The findings page's "Against published results": every study's published comparison in one place.

Each study's number beside the field's is computed by its own reporting path, ``report.published_value(runs)``
(``servelab.studies.common.published``, the table its page shows too), from its committed runs; nothing here reads
a study's files or types a value. A study whose report gives none (not converted yet, not measured, or a report
without ``published_value``) reads "not measured", with the reason.
"""

from __future__ import annotations

from servelab.studies.common.markdown import md_text
from servelab.studies.common.published import load_published, published_section
from servelab_book.findings import SIMULATOR, StudyEvidence  # the simulator: not a study, its own comparison
from servelab_book.studies import STUDIES


def render_all_published(evidence: dict[str, StudyEvidence]) -> str:
    """One table per study that has a published comparison, its H200 value from ``evidence[slug].published``."""
    pub = load_published()
    out = []
    pages = [(s.slug, f"Study {s.number}: {s.title}") for s in STUDIES] + [(SIMULATOR, "The simulator")]
    for slug, heading in pages:
        if not (pub["study"] == slug).any():
            continue
        ev = evidence.get(slug)
        ours = ev.published if ev is not None else None
        if ours is None and ev is not None:
            why = ev.why or (
                "nothing measured on the book's device"
                if not ev.measured
                else "its report gives no published_value"
                if not ev.has_published
                else "its report gives no value for it"
            )
            ours = ("not measured", why)
        out.append(f"### {md_text(heading)}\n\n{published_section(slug, ours, 'H200')}")
    return "\n".join(out)
