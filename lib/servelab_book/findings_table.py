"""The findings table: each of the seed's 22 claims, its RTX 2070 value, its H200 value and verdict.

``findings_table`` joins the seed's claims with the H200 findings and the study pages; the
``render_*`` functions turn it into MyST for the landing page and the findings page. Nothing here is
typed: every value comes from ``data/seed/claims.csv`` (the seed's) or a ``findings.csv`` (the H200's).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab_book.claim_links import claim_target
from servelab_book.studies import STUDIES, StudyPage

NOT_MEASURED = "not yet measured"
INCONCLUSIVE = "inconclusive"  # the repeats disagree: the badge carries each repeat's verdict and the spread
BADGES = {
    "holds": "bdg-success",
    "changes": "bdg-warning",
    "fails": "bdg-danger",
    INCONCLUSIVE: "bdg-info",
    NOT_MEASURED: "bdg-muted",
}
TABLE_COLUMNS = [
    "id",
    "study",
    "claim",
    "rtx2070_value",
    "h200_value",
    "verdict",
    "reason",
    "link",
    "device_name",
    "started_utc",
    "git_commit",
    "repeats",
    "repeat_verdicts",
    "spread",
]


class FindingsMismatch(RuntimeError):
    """Findings and pages disagree, e.g. a measured claim whose page still says "not yet measured"."""


def format_utc(stamp: str) -> str:
    """An ISO time stamp as "2026-12-02 11:31 UTC" (unparseable text passes through)."""
    try:
        t = pd.Timestamp(stamp)
    except (ValueError, TypeError):
        return str(stamp)
    if t.tzinfo is not None:
        t = t.tz_convert("UTC")
    return t.strftime("%Y-%m-%d %H:%M UTC")


def one_line(text: str, limit: int = 160) -> str:
    """The first sentence (or clause before a semicolon) of a note, at most ``limit`` characters: the
    landing page's one-line reason; "…" says the findings page has more."""
    text = " ".join(str(text).split())
    first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0]
    if len(first) > limit:
        return first[: limit - 1].rstrip(" ,;") + "…"
    if first.endswith(";") or (first != text and not first.endswith(".")):
        return first.rstrip(" ,;") + "…"
    return first


def _text(value) -> str:
    """A provenance field as text; missing (None, NaN) is empty."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _repeats(value) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 1


def h200_value(measured, unit: str, spread="", repeats=1) -> str:
    """The H200 column: the value and unit, and for a claim measured over repeats the interval and their count
    ("5.33 × (5.1–8.1 over 3 repeats)")."""
    shown = f"{format_value(measured)} {unit}".strip()
    spread, n = _text(spread).strip(), _repeats(repeats)
    if spread and n > 1:
        shown += f" ({format_value(spread)} over {n} repeats)"
    return shown


def findings_table(seed: pd.DataFrame, findings: pd.DataFrame, pages: list[StudyPage]) -> pd.DataFrame:
    """One row per seed claim, in claim order, with the H200 value and verdict where measured.

    Raises FindingsMismatch when a claim has H200 findings but its page is still the placeholder:
    the executed notebook belongs in ``book/studies`` before the book may show the numbers.
    """
    page_of = {p.study.slug: p for p in pages}
    measured = findings.set_index("id") if len(findings) else pd.DataFrame()
    issue_of = {s.slug: s.issue for s in STUDIES}
    rows, stale = [], []
    for claim in seed.itertuples():
        page = page_of[claim.study]
        row = {
            "id": claim.id,
            "study": claim.study,
            "claim": claim.claim,
            "rtx2070_value": claim.rtx2070_value,
            "link": claim_target(page, claim.id),
            "device_name": "",
            "started_utc": "",
            "git_commit": "",
            "repeats": 0,
            "repeat_verdicts": "",
            "spread": "",
        }
        if claim.id in measured.index:
            f = measured.loc[claim.id]
            if not page.measured:
                stale.append(f"{claim.id} ({page.source.name})")
            unit = str(f["unit"]).strip()
            row.update(
                h200_value=h200_value(f["measured_value"], unit, f.get("spread", ""), f.get("repeats", 1)),
                repeats=_repeats(f.get("repeats", 1)),
                repeat_verdicts=_text(f.get("repeat_verdicts", "")),
                spread=_text(f.get("spread", "")),
                verdict=f["verdict"],
                reason=str(f["note"]),
                device_name=_text(f["device_name"]),
                started_utc=_text(f["started_utc"]),
                git_commit=_text(f["git_commit"]),
            )
        else:
            issue = issue_of[claim.study]
            where = f"issue #{issue}" if issue else "a later issue"
            row.update(
                h200_value="—",
                verdict=NOT_MEASURED,
                reason=f"Study {int(claim.study[:2])} has not run on the H200 yet ({where}).",
            )
        rows.append(row)
    if stale:
        raise FindingsMismatch(
            "H200 findings exist for claims whose study page is still the 'not yet measured' "
            "placeholder: " + ", ".join(stale) + ". Add the executed notebook to book/studies "
            "and delete the placeholder."
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def verdict_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many claims hold, change, fail, are inconclusive or are not yet measured (every key present)."""
    counts = table["verdict"].value_counts()
    return {k: int(counts.get(k, 0)) for k in BADGES}


def render_summary(table: pd.DataFrame) -> str:
    """One sentence: how many of the claims were measured and how the verdicts fall."""
    c = verdict_counts(table)
    measured = len(table) - c[NOT_MEASURED]
    if measured == 0:
        return (
            f"None of the seed's {len(table)} claims has been measured on the H200 yet; "
            f"the table lists them with their RTX 2070 values.\n"
        )
    return (
        f"Of the seed's {len(table)} claims, {measured} have been measured on the H200: "
        f"{c['holds']} hold, {c['changes']} change and {c['fails']} fail"
        + (f"; {c[INCONCLUSIVE]} are inconclusive (their repeats disagree)" if c[INCONCLUSIVE] else "")
        + f"; {c[NOT_MEASURED]} are not yet measured.\n"
    )


def _badge(verdict: str, repeat_verdicts: str = "") -> str:
    """The verdict's badge; an inconclusive one is followed by what each repeat said ("holds, holds, changes")."""
    badge = f"{{{BADGES[verdict]}}}`{verdict}`"
    said = [v for v in str(repeat_verdicts or "").split(";") if v]
    if verdict == INCONCLUSIVE and said:
        badge += f" ({md_text(', '.join(said))})"
    return badge


def render_landing_table(table: pd.DataFrame) -> str:
    """The compact table of the landing page: claim, RTX 2070, H200, verdict, one-line reason."""
    header = ["Claim", "The seed's claim", "RTX 2070", "H200", "Verdict", "Why"]
    rows = [
        [
            f"[{r.id}]({r.link})",
            md_text(r.claim),
            md_text(r.rtx2070_value),
            md_text(r.h200_value),
            _badge(r.verdict, r.repeat_verdicts),
            md_text(one_line(r.reason)),
        ]
        for r in table.itertuples()
    ]
    return list_table(header, rows, [6, 26, 14, 14, 10, 30])


def render_by_study(table: pd.DataFrame, titles: dict[str, str] | None = None) -> str:
    """The findings page: one section per study (titled as its page, ``titles[slug]``) with its run's
    provenance and the full notes."""
    out = []
    for s in STUDIES:
        part = table[table["study"] == s.slug]
        if part.empty:
            continue
        title = (titles or {}).get(s.slug) or f"Study {s.number}: {s.title}"
        out.append(f"## {md_text(title)}\n")
        measured = part[part["verdict"] != NOT_MEASURED]
        if len(measured):
            r = measured.iloc[0]
            out.append(
                f"Measured on {md_text(r.device_name)}, run started {md_text(format_utc(r.started_utc))}, "
                f"commit `{r.git_commit[:12]}`. {{doc}}`The study's page </{s.docname}>`.\n"
            )
        else:
            out.append(
                f"{md_text(part.iloc[0].reason)} {{doc}}`The study's page </{s.docname}>` "
                f"lists its question and the seed's claims.\n"
            )
        header = ["Claim", "The seed's claim", "RTX 2070", "H200", "Verdict", "Reason"]
        rows = [
            [
                f"[{r.id}]({r.link})",
                md_text(r.claim),
                md_text(r.rtx2070_value),
                md_text(r.h200_value),
                _badge(r.verdict, r.repeat_verdicts),
                md_text(r.reason),
            ]
            for r in part.itertuples()
        ]
        out.append(list_table(header, rows, [6, 24, 14, 14, 10, 32]))
    return "\n".join(out)
