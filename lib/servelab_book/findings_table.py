"""The findings table: each of the seed's 22 claims, its RTX 2070 value, its H200 value, verdict and evidence.

``findings_table`` joins the seed's claims with the findings the studies' reports computed when the book was prepared
(``findings.book_findings``) and the study pages; the ``render_*`` functions turn it into MyST for the landing page
and the findings page. Nothing here is typed: every value comes from ``data/seed/claims.csv`` (the seed's) or a
study's report over its committed runs (the H200's). The evidence of each claim: how many repeats, the interval of
its headline over them, the models it was tested on and their kind (random weights, SmolLM2-135M-Instruct's trained
weights, drafts distilled from it, random inputs) and whether its data is fresh (today's measuring code) or stale.
The landing table's "Why" is the verdict's reason read from the report's note (``landing_reason``): the headline
against its rule, or for an inconclusive claim why it is inconclusive. A claim without data, or with too little,
reads **inconclusive** with the reason, never "fails".
"""

from __future__ import annotations

import math
import re

import pandas as pd

from servelab.studies.common.findings import split_repeat_label
from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab.studies.common.repeats import MIN_REPEATS, PER_PART, spread_unit, spread_with_unit
from servelab.studies.common.runs import MISSING
from servelab_book.claim_links import claim_target
from servelab_book.studies import STUDIES, StudyPage

INCONCLUSIVE = "inconclusive"  # too little data, or repeats that disagree: the reason says which
NOT_MEASURED = "not measured"  # the H200 value of a claim with no data (its verdict: inconclusive)
BADGES = {
    "holds": "bdg-success",
    "changes": "bdg-warning",
    "fails": "bdg-danger",
    INCONCLUSIVE: "bdg-info",
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
    "runs",
    "first_started_utc",
    "last_started_utc",
    "commits",
    "repeats",
    "repeat_verdicts",
    "spread",
    "headline_unit",
    "tested_on",
    "freshness",
    "changed",
    "source",  # the study whose report judged the claim, where another than its own (F2.3: 08_simulator)
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


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, never inside a word: at the last clause boundary ("; " or ", ")
    in the second half of the limit, else the last space, followed by "…" (a single word longer than the limit is
    cut where it must be)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    cut = max(head.rfind("; "), head.rfind(", "))
    if cut < limit // 2:
        cut = head.rfind(" ")
    return (head[:cut] if cut > 0 else head).rstrip(" ,;:") + "…"


def one_line(text: str, limit: int = 160) -> str:
    """The first sentence (or clause before a semicolon) of a note, at most ``limit`` characters, cut between words:
    a one-line summary; "…" says the full text has more."""
    text = " ".join(str(text).split())
    first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0]
    if len(first) > limit:
        return clip(first, limit)
    if first.endswith(";") or (first != text and not first.endswith(".")):
        return first.rstrip(" ,;") + "…"
    return first


# ---- the landing table's "Why": the verdict's reason, from the note the study's report wrote ----------------------

WHY_LIMIT = 280  # characters of a landing reason; the findings page has the whole note
_OVER_REPEATS = re.compile(r",\s*[^,;()]*?\bover \d+ repeats\s*\([^()]*\)")  # an interval: the Evidence column's
_REPEAT_SAYS = re.compile(r"^the \d+ repeats say\b")
_NAMES_REPEAT = re.compile(r"\brepeat (\d+) of (\d+)\b", re.IGNORECASE)


def split_brackets(note: str) -> tuple[str, list[str]]:
    """A note's prose with its top-level ``[...]`` groups taken out, and those groups' contents in order: the
    "[from repeat k of n, ...]" label, the headline over repeats ("[median ..., ... over 3 repeats (...); the rule:
    ...]"), "[rests on 2 repeats; ...]"."""
    prose, groups, depth, current = [], [], 0, []
    for c in str(note):
        if c == "[":
            depth += 1
            if depth == 1:
                current = []
                continue
        elif c == "]" and depth:
            depth -= 1
            if depth == 0:
                groups.append("".join(current).strip())
                continue
        (current if depth else prose).append(c)
    return " ".join("".join(prose).split()).replace(" .", "."), groups


def _sentences(prose: str) -> list[str]:
    """The prose's sentences (a period then a space ends one; a number's decimal point has no space after it)."""
    return [s.strip() for s in re.split(r"(?<=\.)\s+", prose) if s.strip()]


def _clauses(group: str) -> list[str]:
    """A bracket group's "; "-separated clauses, a clause in parentheses kept whole."""
    out, depth, current = [], 0, ""
    for i, c in enumerate(group):
        depth += c == "("
        depth -= c == ")" and depth > 0
        if c == ";" and depth == 0 and group[i + 1 : i + 2] == " ":
            out.append(current.strip())
            current = ""
            continue
        current += c
    return [c for c in out + [current.strip()] if c]


def headline_reason(groups: list[str]) -> tuple[str, str]:
    """The headline a verdict was decided on, without its interval (the Evidence column has it), and the rule it
    was held to: ("median 7.588 × naive / SDPA default at 2,048 tokens", "holds within 2× of 7.64"); ("", "")
    where no group gives a headline over repeats."""
    for g in groups:
        if not (" repeats (" in g or re.search(r"in each of the \d+ repeats", g) or g.startswith("per model:")):
            continue
        said, rule = [], ""
        for c in _clauses(g.removeprefix("per model:").strip()):
            if c.startswith("the rule:"):
                rule = c.removeprefix("the rule:").strip()
            elif not _REPEAT_SAYS.match(c):
                said.append(_OVER_REPEATS.sub("", c).strip())
        said = [s for s in said if s]
        if g.startswith("per model:"):
            said = _one_unit(said)
        return format_value("; ".join(said)), format_value(rule)
    return "", ""


def _one_unit(said: list[str]) -> list[str]:
    """Each model's headline in one unit, the unit said once: ["a median 93.97 % cut (x)", "b median 30.78 % cut
    (x)"] -> ["a median 93.97, b median 30.78 % cut (x)"]; as they are where the units differ."""
    parts = [re.fullmatch(r"(\S+ (?:median )?-?[\d.,]+) (.+)", s) for s in said]
    if len(parts) < 2 or not all(parts) or len({m.group(2) for m in parts}) != 1:
        return said
    return [", ".join(m.group(1) for m in parts) + " " + parts[0].group(2)]


def _without_cross_references(text: str) -> str:
    """A sentence without its pointers to other sections ("(listed under *Steps held up on the host*)"), which
    lead nowhere from the landing page."""
    return " ".join(re.sub(r"\s*\((?:listed|see|as) [^()]*\)", "", text).split())


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text.endswith((".", "…")) else text + "."


def _lower_first(text: str) -> str:
    """A sentence continued after a colon: "Repeat 2 of 3's ..." -> "repeat 2 of 3's ..." (a name keeps its case)."""
    return text[0].lower() + text[1:] if re.match(r"[A-Z][a-z]+\b", text) else text


def inconclusive_reason(note: str, repeat_verdicts: str) -> str:
    """Why a claim is inconclusive, from what its repeats said and its note: the note's own sentence where it
    says (F2.3: "..., inconclusive as Study 1's repeat 3 of 3 lacks 2 of its parts."); else which repeats are
    missing or too thin, whether the measured ones disagree, and the note's sentence about the repeat that stands
    apart (F3.3: its eager ratio "is not physically plausible"; F1.2: one step held on the host)."""
    prose, _ = split_brackets(note)
    sentences = _sentences(prose)
    own = next((s for s in sentences if "inconclusive" in s and not s.startswith("Per model")), "")
    if own and re.search(r"inconclusive (as|because|since)\b", own):
        return _sentence(_without_cross_references(own))
    said = [v.strip() for v in str(repeat_verdicts or "").split(";")]
    n = len(said)
    missing = [i + 1 for i, v in enumerate(said) if v in ("", MISSING)]
    thin = [i + 1 for i, v in enumerate(said) if v == INCONCLUSIVE]
    measured = [v for v in said if v not in ("", MISSING, INCONCLUSIVE)]
    parts = []
    if missing:
        parts.append(
            f"repeat{'s' if len(missing) > 1 else ''} {_and([str(k) for k in missing])} of {n} "
            f"{'were' if len(missing) > 1 else 'was'} not measured"
        )
    if thin:
        parts.append(f"repeat {_and([str(k) for k in thin])} of {n} had too little data for its rule")
    if len(set(measured)) > 1:
        whose = "the repeats" if len(measured) == n else f"the {len(measured)} measured"
        parts.append(
            f"{whose} disagree ({', '.join(measured)})"
            + (f", and a verdict needs {MIN_REPEATS}" if len(measured) < MIN_REPEATS else "")
        )
    elif measured:
        whose = "the other" if parts else "the"
        parts.append(
            f"{whose} {len(measured)} {'says' if len(measured) == 1 else 'say'} {measured[0]}"
            + (f", and a verdict needs {MIN_REPEATS}" if len(measured) < MIN_REPEATS else "")
        )
    lead = "; ".join(parts) or "the repeats do not settle it"
    # the note's account of the repeat that stands apart: the odd one out, or one that is missing or too thin
    counts = {v: measured.count(v) for v in measured}
    top = max(counts.values(), default=0)
    odd = {i + 1 for i, v in enumerate(said) if v in counts and counts[v] < top} | set(missing) | set(thin)
    why = next(
        (
            s
            for s in sentences
            if not s.startswith("Per model") and any(int(m.group(1)) in odd for m in _NAMES_REPEAT.finditer(s))
        ),
        "",
    )
    text = _capital(lead)
    if why:
        text += ": " + _lower_first(_without_cross_references(why))
    return clip(_sentence(text), WHY_LIMIT)


def _capital(text: str) -> str:
    """A sentence's first word capitalised where it is a plain word ("median" -> "Median"); a name keeps its case
    ("llama-3-8b", "qwen2-0.5b")."""
    return text[0].upper() + text[1:] if re.match(r"[a-z]+(?=[\s,:;])", text) else text


def _rule_in(sentence: str) -> str:
    """The rule where a note's sentence states it ("...: holds for a 20-70% cut, changes outside it, fails at <= 5%"),
    "" where it does not."""
    m = re.search(r"\bholds (?:if|for|within|at|from|above|below|when)\b[^.]*", sentence)
    return m.group(0).rstrip(" .;,") if m else ""


def _bound_clause(sentence: str) -> str:
    """The clause of a note's sentence that names what bounds the time ("decode here is bound by kernel launches and
    framework overhead, not by HBM bandwidth"): the hardware reason, where the note gives one."""
    for clause in re.split(r";\s+", sentence):
        if re.search(r"\bbound by\b|\b(?:compute|memory|bandwidth|launch)-bound\b", clause):
            return _without_cross_references(re.sub(r"\s*\([^()]*\)\s*$", "", clause.rstrip(". ")))
    return ""


def landing_reason(row) -> str:
    """The landing table's "Why": the verdict's reason, not the setup or the rule alone. Inconclusive: why
    (``inconclusive_reason``). A claim judged per model: the note's per-model verdicts, the rule, then each model's
    headline. Else the headline against its rule ("Median 0.9992 × compaction speedup during decode; the rule:
    holds within 1.15–1.6× where its CI lies above 1"), with what bounds the time where the note's first sentence
    says; where the note gives no rule, its first sentence."""
    note = _text(row.reason)
    if row.verdict == INCONCLUSIVE:
        if row.h200_value == NOT_MEASURED:
            return one_line(note, WHY_LIMIT)
        return inconclusive_reason(note, _text(getattr(row, "repeat_verdicts", "")))
    prose, groups = split_brackets(note)
    sentences = _sentences(prose)
    first = sentences[0] if sentences else note
    headline, rule = headline_reason(groups)
    per_model = next((s for s in sentences if s.startswith("Per model:")), "")
    if per_model:
        rule = rule or _rule_in(first)
        text = _sentence(per_model) + (f" The rule: {rule}." if rule else "")
        text += f" {_sentence(_capital(headline))}" if headline else ""
    elif headline and rule:
        text = _sentence(f"{_capital(headline)}; the rule: {rule}")
        bound = _bound_clause(first)
        text += f" {_sentence(_capital(bound))}" if bound else ""
    else:
        text = _sentence(_capital(first))
    return clip(text, WHY_LIMIT)


def _text(value) -> str:
    """A provenance field as text; missing (None, NaN) is empty."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _repeats(value) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 1


def tested_kinds(tested_on: str) -> str:
    """What a verdict rests on, in the landing table's words: "random weights", "trained toy", "SmolLM2-135M"
    (several joined by " + "); "—" where the finding does not say."""
    text = str(tested_on or "").lower()
    kinds = []
    if "random weights" in text:
        kinds.append("random weights")
    if "random n(0, 1)" in text or "random inputs" in text:
        kinds.append("random inputs")
    if "simulator" in text:
        kinds.append("policy simulator")
    if "smollm2" in text:
        kinds.append("SmolLM2-135M")
    if "toy" in text or ("trained" in text and "smollm2" not in text):
        kinds.append("trained toy")
    return " + ".join(kinds) or "—"


def _config_names() -> list[str]:
    """The architecture-exact configs the loader ships (``data/models/``), longest first, so that "qwen2-0.5b-vocab128k"
    is found before "qwen2-0.5b"."""
    from servelab.models.loader import shipped_configs

    return sorted(shipped_configs(), key=len, reverse=True)


def tested_models(tested_on: str) -> str:
    """The models a verdict was tested on, each group with its kind, in the order the finding names them:
    "llama-3-8b, qwen2-0.5b (random weights)"; "SmolLM2-135M-Instruct (trained weights) + smollm2-draft-2L,
    smollm2-draft-6L (distilled drafts)"; "qwen2-1.5b (attention alone, random inputs)". Where the finding names no
    model the loader knows, its kind alone (``tested_kinds``: "policy simulator")."""
    text = str(tested_on or "")
    found: list[tuple[int, str]] = []
    for m in re.finditer(r"(?<![\w.-])SmolLM2-[\w.-]*\w", text, re.IGNORECASE):  # the trained model and its drafts
        found.append((m.start(), m.group(0)))
    for name in _config_names():
        for m in re.finditer(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text):
            if not any(start <= m.start() < start + len(n) for start, n in found):  # inside a longer name found
                found.append((m.start(), name))
    names = list(dict.fromkeys(n for _, n in sorted(found)))
    if not names:
        return tested_kinds(text)
    lower = text.lower()
    trained = [n for n in names if n.lower().startswith("smollm2") and "draft" not in n.lower()]
    drafts = [n for n in names if n.lower().startswith("smollm2") and "draft" in n.lower()]
    configs = [n for n in names if not n.lower().startswith("smollm2")]
    config_kind = [k for k in ("attention alone",) if k in lower]
    config_kind += [k for k in ("random weights",) if k in lower]
    config_kind += ["random inputs"] if "random n(0, 1)" in lower or "random inputs" in lower else []
    groups = [
        (trained, "trained weights"),
        (drafts, "distilled drafts"),
        (configs, ", ".join(config_kind)),
    ]
    return " + ".join(", ".join(g) + (f" ({kind})" if kind else "") for g, kind in groups if g)


def evidence_text(row, models: bool = True) -> str:
    """The landing table's evidence cell: repeats, the interval over them, what it was tested on (the models and
    their kind, ``tested_models``; with ``models=False`` left to the caller, which shows ``tested_on`` whole), fresh
    or stale."""
    if row.h200_value == NOT_MEASURED or row.freshness == "no data":
        return "no data"
    n = _repeats(row.repeats)
    ran = sum(v not in ("", MISSING) for v in _text(getattr(row, "repeat_verdicts", "")).split(";"))
    # a repeat too thin for its rule ran but gave no number: the value rests on fewer repeats than judged the claim
    parts = [f"{n} of {ran} repeats measured it" if ran > n else f"{n} repeat{'s' if n != 1 else ''}"]
    spread = _text(row.spread).strip()
    if spread:  # with its unit: "interval 6.29–6.595" left the reader to guess what it measured
        unit = spread_unit(spread, _text(getattr(row, "headline_unit", "")))
        parts.append(f"interval {spread_with_unit(spread, unit)}")
    if models:
        parts.append(tested_models(row.tested_on))
    parts.append(row.freshness)
    return "; ".join(parts)


def h200_value(measured, unit: str, spread="", repeats=1, headline_unit: str = "") -> str:
    """The H200 column: the value, its unit where the value is a bare number (a worded value carries its own), and
    for a claim measured over repeats the repeats' count and the interval of its headline statistic with that
    statistic's unit ("5.33 × (3 repeats: 5.1–8.1 ×)"; the count came last, where a unit with commas of its own
    ran into it). The interval is of the headline, which need not be the value shown (F4.2 shows a range over
    contexts; its headline is the largest fitted trend)."""
    label, rest = split_repeat_label(measured) if isinstance(measured, str) else ("", measured)
    text = format_value(rest)
    bare = text[:1].isdigit() and text[-1:].isdigit()
    shown = label + (f"{text} {unit}".strip() if bare else text)
    spread, n = _text(spread).strip(), _repeats(repeats)
    if spread and n > 1:
        hu, said = spread_unit(spread, _text(headline_unit)), f"{n} repeats:"
        if spread.startswith(PER_PART):  # each model's interval, in a model's unit (not the median over models')
            said = f"{n} repeats,"
        shown += f" ({said} {spread_with_unit(spread, hu)})"
    return shown


def _is_not_measured(measured_value) -> bool:
    return str(measured_value).strip().lower() in ("not measured", "")


def findings_table(seed: pd.DataFrame, findings: pd.DataFrame, pages: list[StudyPage]) -> pd.DataFrame:
    """One row per seed claim, in claim order, with the H200 value, verdict and evidence.

    A claim no report judged reads inconclusive, with the reason. Raises FindingsMismatch when a claim has measured
    H200 findings but its page is still the placeholder: the rendered notebook belongs in ``book/studies``.
    """
    page_of = {p.study.slug: p for p in pages}
    measured = findings.set_index("id") if len(findings) else pd.DataFrame()
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
            "runs": 0,
            "first_started_utc": "",
            "last_started_utc": "",
            "commits": "",
            "repeats": 0,
            "repeat_verdicts": "",
            "spread": "",
            "headline_unit": "",
            "tested_on": "",
            "freshness": "no data",
            "changed": "",
            "source": "",
        }
        if claim.id in measured.index:
            f = measured.loc[claim.id]
            nothing = _is_not_measured(f["measured_value"])
            if not page.measured and not nothing:
                stale.append(f"{claim.id} ({page.source.name})")
            unit = str(f["unit"]).strip()
            row.update(
                h200_value=NOT_MEASURED
                if nothing
                else h200_value(
                    f["measured_value"], unit, f.get("spread", ""), f.get("repeats", 1), f.get("headline_unit", "")
                ),
                repeats=0 if nothing else _repeats(f.get("repeats", 1)),
                repeat_verdicts=_text(f.get("repeat_verdicts", "")),
                spread=_text(f.get("spread", "")),
                headline_unit=_text(f.get("headline_unit", "")),
                verdict=f["verdict"],
                reason=str(f["note"]),
                device_name=_text(f["device_name"]),
                started_utc=_text(f["started_utc"]),
                git_commit=_text(f["git_commit"]),
                runs=int(f.get("runs", 0) or 0),
                first_started_utc=_text(f.get("first_started_utc", "")),
                last_started_utc=_text(f.get("last_started_utc", "")),
                commits=_text(f.get("commits", "")),
                tested_on=_text(f.get("tested_on", "")),
                freshness="no data" if nothing else _text(f.get("freshness", "")) or "no data",
                changed=_text(f.get("changed", "")),
                source="" if _text(f.get("source", "")) == claim.study else _text(f.get("source", "")),
            )
        else:
            row.update(
                h200_value=NOT_MEASURED,
                verdict=INCONCLUSIVE,
                reason=f"Not measured: Study {int(claim.study[:2])}'s report gives no verdict on this claim.",
            )
        rows.append(row)
    if stale:
        raise FindingsMismatch(
            "H200 findings exist for claims whose study page is still the 'not yet measured' "
            "placeholder: " + ", ".join(stale) + ". Render the page (python -m servelab_book render) "
            "and delete the placeholder."
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def verdict_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many claims hold, change, fail or are inconclusive (every key present), and how many of those have no
    data at all (``not measured``)."""
    counts = table["verdict"].value_counts()
    out = {k: int(counts.get(k, 0)) for k in BADGES}
    out[NOT_MEASURED] = int((table["h200_value"] == NOT_MEASURED).sum())
    out["stale"] = int((table["freshness"] == "stale").sum())
    return out


def render_summary(table: pd.DataFrame) -> str:
    """One sentence: how many of the claims were measured, how the verdicts fall, and how many rest on stale data."""
    c = verdict_counts(table)
    measured = len(table) - c[NOT_MEASURED]
    if measured == 0:
        return (
            f"None of the seed's {len(table)} claims has data on the H200 yet, so every verdict reads inconclusive; "
            f"the table lists them with their RTX 2070 values.\n"
        )
    thin = c[INCONCLUSIVE] - c[NOT_MEASURED]
    return (
        f"Of the seed's {len(table)} claims, {measured} {_verb(measured, 'has', 'have')} H200 data: "
        f"{c['holds']} {_verb(c['holds'], 'holds', 'hold')}, {c['changes']} {_verb(c['changes'], 'changes', 'change')} "
        f"and {c['fails']} {_verb(c['fails'], 'fails', 'fail')}"
        + (
            f"; {thin} {_verb(thin, 'is', 'are')} inconclusive (too few repeats, or repeats that disagree)"
            if thin
            else ""
        )
        + (
            f"; {c[NOT_MEASURED]} {_verb(c[NOT_MEASURED], 'is', 'are')} not measured yet (inconclusive)"
            if c[NOT_MEASURED]
            else ""
        )
        + (
            f". {c['stale']} {_verb(c['stale'], 'rests', 'rest')} on data measured by older code (stale)"
            if c["stale"]
            else ""
        )
        + ".\n"
    )


def _verb(count: int, one: str, many: str) -> str:
    """The verb that agrees with a count of claims ("1 is", "3 are")."""
    return one if count == 1 else many


def _badge(verdict: str, repeat_verdicts: str = "") -> str:
    """The verdict's badge; an inconclusive one is followed by what each repeat said ("holds, holds, changes")."""
    badge = f"{{{BADGES[verdict]}}}`{verdict}`"
    said = [v for v in str(repeat_verdicts or "").split(";") if v]
    if verdict == INCONCLUSIVE and said:
        badge += f" ({md_text(', '.join(said))})"
    return badge


def render_landing_table(table: pd.DataFrame) -> str:
    """The compact table of the landing page: claim, RTX 2070, H200, verdict, evidence, one-line reason."""
    header = ["Claim", "The seed's claim", "RTX 2070", "H200", "Verdict", "Evidence", "Why"]
    rows = [
        [
            f"[{r.id}]({r.link})",
            md_text(r.claim),
            md_text(r.rtx2070_value),
            md_text(r.h200_value),
            _badge(r.verdict, r.repeat_verdicts),
            md_text(evidence_text(r)),
            md_text(landing_reason(r)),
        ]
        for r in table.itertuples()
    ]
    return list_table(header, rows, [6, 22, 12, 12, 9, 15, 24])


def _runs_text(r) -> str:
    """Which runs a study's verdicts read: "28 runs started 2026-12-04 05:45 UTC to 2026-12-06 06:07 UTC, at
    commits `493e2b2`, `50ec960`"; a row without that count (findings from before it was kept) names its first run."""
    n = int(getattr(r, "runs", 0) or 0)
    if n <= 1 or not _text(getattr(r, "first_started_utc", "")):
        return f"run started {md_text(format_utc(r.started_utc))}, commit `{r.git_commit[:12]}`"
    first, last = format_utc(r.first_started_utc), format_utc(r.last_started_utc)
    when = f"started {first}" if first == last else f"started {first} to {last}"
    commits = [c for c in _text(r.commits).split(", ") if c]
    which = f"commit{'s' if len(commits) != 1 else ''} " + ", ".join(f"`{c}`" for c in commits)
    return md_text(f"{n} runs {when}") + ", at " + which


# a claim's judging report as the reader knows its page, and the runs that page judges it on. Not the judging study's
# own runs: the simulator's are timings of its own speed, which F2.3 never reads (they were cited as its provenance)
JUDGING_PAGES = {
    "08_simulator": "the simulator page, which replays Study 1's server runs (listed under Study 1) and compares "
    "its predictions with what those runs measured"
}


def _judged_elsewhere_text(r) -> str:
    """What a claim judged by another study's report rests on, for its Evidence cell: the runs that page judges it
    on, which are neither the study's own (its header names those) nor the judging study's own (the simulator's
    time its speed); a report the book does not name here gives its runs."""
    page = JUDGING_PAGES.get(r.source)
    return f"judged on {page}" if page else f"judged on {r.source}'s {_runs_text(r)}"


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
        measured = part[part["h200_value"] != NOT_MEASURED]
        own = measured[measured["source"] == ""]
        if len(measured):
            r = (own if len(own) else measured).iloc[0]
            fresh = (
                "measured by today's measuring code (fresh)"
                if r.freshness == "fresh"
                else f"measured by older code (stale; changed since: {md_text(r.changed) or 'unknown'})"
            )
            elsewhere = measured[measured["source"] != ""]["id"].tolist()
            others = (
                f" {', '.join(elsewhere)} {'is' if len(elsewhere) == 1 else 'are'} judged on other runs, which "
                f"{'its' if len(elsewhere) == 1 else 'their'} Evidence names."
                if elsewhere
                else ""
            )
            out.append(
                f"Measured on {md_text(r.device_name)}, {_runs_text(r)}, {fresh}. Verdicts: today's rules applied to "
                f"that data.{others} {{doc}}`The study's page </{s.docname}>`.\n"
            )
        else:
            out.append(
                f"{md_text(part.iloc[0].reason)} {{doc}}`The study's page </{s.docname}>` "
                f"lists its question and the seed's claims.\n"
            )
        header = ["Claim", "The seed's claim", "RTX 2070", "H200", "Verdict", "Evidence", "Reason"]
        rows = [
            [
                f"[{r.id}]({r.link})",
                md_text(r.claim),
                md_text(r.rtx2070_value),
                md_text(r.h200_value),
                _badge(r.verdict, r.repeat_verdicts),
                md_text(evidence_text(r, models=not r.tested_on) + (f"; {r.tested_on}" if r.tested_on else ""))
                + (f"; {_judged_elsewhere_text(r)}" if r.source and r.h200_value != NOT_MEASURED else ""),
                md_text(r.reason),
            ]
            for r in part.itertuples()
        ]
        out.append(list_table(header, rows, [6, 20, 12, 12, 9, 17, 24]))
    return "\n".join(out)
