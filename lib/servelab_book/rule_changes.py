"""The methodology page's "Rule changes" section, generated from the rule registry (``data/rules.yml``).

For each claim: when its rule was registered, whether it changed after the claim's first H200 measurement, and the
verdict the rule in force gives today. For each change: the old rule, the new rule, why, and the verdicts both give
on the **same data**, the study's committed runs (``common.runs.study_runs``), both computed now:

- the rule in force: the verdict of the study's report (``report(runs).findings``, today's rules combined over the
  repeats), as the findings table shows it;
- the old rule: the registry's function for it (``servelab.studies.common.rules.OLD_RULES``) applied to each repeat
  of the same runs and combined the same way (``rules.old_verdict``).

Missing or too-thin data reads inconclusive with the reason, for both.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.common.rules import Rule, old_verdict
from servelab_book.findings_table import one_line


def reader_why(why: str) -> str:
    """A change's recorded reason as a reader gets it: without the tracker's issue number it opens with ("Issue 23:
    a run's single maximum gap ..."), which means nothing outside this repository. The recorded text (hash-chained
    in ``data/rules.yml``) keeps it."""
    said = re.sub(r"^Issue \d+:\s*", "", why.strip())
    return said[:1].upper() + said[1:]


def _in_force(table: pd.DataFrame, claim: str) -> tuple[str, str]:
    """The verdict today's rule gives (the report's, as the findings table shows it) and its reason."""
    row = table[table["id"] == claim]
    if not len(row):
        return "inconclusive", "no report judged this claim"
    return str(row["verdict"].iat[0]), str(row["reason"].iat[0])


def render_rule_changes(
    rules: dict[str, Rule], table: pd.DataFrame, results_root: Path, device: str | None = "h200"
) -> str:
    """MyST: the registry's table with each rule's verdict today, then one subsection per rule change with the old
    rule's and the rule in force's verdicts on the same runs. ``table``: ``findings_table.findings_table``."""
    from servelab.studies.common.runs import study_runs

    changed = [r for r in rules.values() if r.changes]
    rows = [
        [
            r.id,
            md_text(r.registered),
            f"`{r.registered_commit[:7]}`",
            f"`{r.first_h200[:7]}`" if r.first_h200 else "—",
            md_text(f"{len(r.changes)} change(s), see below" if r.changes else "none"),
            f"**{md_text(_in_force(table, r.id)[0])}**",
        ]
        for r in rules.values()
    ]
    out = [
        f"Every claim's verdict rule is registered in `data/rules.yml` with the date of the commit that introduced it. "
        f"{len(changed)} of the {len(rules)} rules were changed after their claim's first H200 measurement; each "
        "change is listed below with the verdicts the old rule and the rule in force give on the same committed "
        "runs, both computed when this book was built.\n",
        list_table(
            ["Claim", "Registered", "Commit", "First H200 run", "Changed after it", "Rule in force, today's data"],
            rows,
            css="servelab-rules",
        ),
    ]
    runs_of: dict[str, object] = {}
    for r in changed:
        if r.study not in runs_of:
            runs_of[r.study] = study_runs(r.study, results_root, device=device)
        now, why = _in_force(table, r.id)
        for ch in r.changes:
            try:
                old = old_verdict(r, ch, runs_of[r.study])
                old_text = f"**{old.verdict}** ({md_text(old.detail)})"
            except (FileNotFoundError, KeyError, ValueError, IndexError) as e:
                old_text = f"**inconclusive** ({md_text(f'not computable on these runs: {e}')})"
            out.append(
                f"### {r.id}: changed {md_text(ch.date)} (`{ch.commit[:7]}`)\n\n"
                f"Old rule\n: {md_text(ch.old_rule)}\n\nNew rule\n: {md_text(ch.new_rule)}\n\n"
                f"Why\n: {md_text(reader_why(ch.why))}\n\n"
                f"Verdicts on the same data\n: the old rule says {old_text}; the rule in force says "
                f"**{md_text(now)}** ({md_text(one_line(why, 240))}).\n"
            )
    return "\n".join(out)
