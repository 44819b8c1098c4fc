"""The methodology page's "Rule changes" section, generated from the rule registry (``data/rules.yml``).

For each claim: when its rule was registered and whether it changed after the claim's first H200 measurement; for
each such change, the old rule, the new rule, why, and the verdicts both give on today's committed data: the old
one computed by the registry's function for it (``servelab.studies.common.rules.OLD_RULES``), the new one the
book's findings table shows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.common.rules import Rule, old_verdict


def _today(findings: pd.DataFrame, claim: str) -> str:
    row = findings[findings["id"] == claim]
    return str(row["verdict"].iat[0]) if len(row) else "not yet measured"


def render_rule_changes(rules: dict[str, Rule], findings: pd.DataFrame, results_root: Path) -> str:
    """MyST: the registry's table, then one subsection per rule change with the old rule's verdict today."""
    changed = [r for r in rules.values() if r.changes]
    rows = [
        [
            r.id,
            md_text(r.registered),
            f"`{r.registered_commit[:7]}`",
            f"`{r.first_h200[:7]}`" if r.first_h200 else "—",
            md_text(f"{len(r.changes)} change(s), see below" if r.changes else "none"),
        ]
        for r in rules.values()
    ]
    out = [
        f"Every claim's verdict rule is registered in `data/rules.yml` with the date of the commit that introduced it. "
        f"{len(changed)} of the {len(rules)} rules were changed after their claim's first H200 measurement; each "
        "change is listed below with the verdict the old rule gives on today's committed data.\n",
        list_table(["Claim", "Registered", "Commit", "First H200 run", "Changed after it"], rows, css="servelab-rules"),
    ]
    for r in changed:
        for ch in r.changes:
            try:
                old = old_verdict(r, ch, results_root)
                old_text = f"**{old.verdict}** ({md_text(old.detail)})"
            except (FileNotFoundError, KeyError) as e:
                old_text = md_text(f"not computable: {e}")
            out.append(
                f"### {r.id}: changed {md_text(ch.date)} (`{ch.commit[:7]}`)\n\n"
                f"Old rule\n: {md_text(ch.old_rule)}\n\nNew rule\n: {md_text(ch.new_rule)}\n\n"
                f"Why\n: {md_text(ch.why)}\n\n"
                f"Verdicts on today's data\n: the old rule says {old_text}; the rule in force says "
                f"**{md_text(_today(findings, r.id))}**.\n"
            )
    return "\n".join(out)
