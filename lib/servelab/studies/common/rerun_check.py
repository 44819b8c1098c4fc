"""Do a study's verdicts repeat? Its campaign's repeats against a re-run's, each judged alone by today's rules.

A page's verdicts rest on the complete repeats of its study at one fingerprint. The campaign measures three; a
re-run measures three more at the same fingerprint (``make gpu-plan REPEATS=6 STUDIES=<study>`` lists its jobs,
fresh processes with seeds default + 3, 4, 5). Here the first three complete repeats (by repeat index) and the rest
are each put through the study's report on their own, so each half gives its verdicts as a page of three repeats
would. A claim repeats when the re-run reads what the campaign read; a claim the campaign read **inconclusive**
already said that its repeats do not settle it, so any re-run verdict is consistent with it (the issue's test:
"a re-run gives the same verdicts, or the claim already reads inconclusive"). The page itself shows every repeat
pooled, which this check leaves as it is.

Reporting only: it reads committed runs and measures nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from servelab.studies.common.repeats import INCONCLUSIVE, MIN_REPEATS
from servelab.studies.common.runs import RunSet, study_runs

COLUMNS = ["claim", "campaign", "re-run", "page", "repeats"]
RERUN_REPEATS = 2 * MIN_REPEATS  # the campaign's repeats and as many again


@dataclass(frozen=True)
class Halves:
    """The campaign's complete repeats and the re-run's, as two run sets of the same fingerprint."""

    campaign: RunSet
    rerun: RunSet


def whole_repeats(runs: RunSet) -> list[int]:
    """The repeat indices of ``runs`` that measured every part any repeat measured, in order."""
    parts = runs.parts
    return [i for i in runs.repeats if runs.repeat(i).has_parts(parts)]


def halves(runs: RunSet, first: int = MIN_REPEATS) -> Halves | None:
    """The first ``first`` whole repeats and the whole repeats after them, or None where the re-run has fewer than
    ``first`` (a re-run of fewer repeats than a page needs could only read inconclusive)."""
    whole = whole_repeats(runs)
    if len(whole) < 2 * first:
        return None
    a, b = set(whole[:first]), set(whole[first:])
    return Halves(
        replace(runs, runs=tuple(r for r in runs.runs if r.repeat in a)),
        replace(runs, runs=tuple(r for r in runs.runs if r.repeat in b)),
    )


def consistent(campaign: str, rerun: str) -> bool:
    """The re-run's verdict agrees with the campaign's, or the campaign's was inconclusive already."""
    return campaign in (rerun, INCONCLUSIVE)


def compare(
    study: str,
    runs: RunSet | None = None,
    *,
    report: Callable[[RunSet], object] | None = None,
    page: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row a claim of ``study``: its verdict from the campaign's repeats, from the re-run's, and on the page
    (``page``: claim -> verdict, where the caller has the pooled findings; else the report is run on every repeat),
    with ``repeats`` naming the repeat indices of each half. Empty where the study has no re-run yet.
    ``report``: the study's report (default: its reporting door), taking a run set, giving a page with
    ``findings``."""
    runs = study_runs(study) if runs is None else runs
    split = halves(runs)
    if split is None:
        return pd.DataFrame(columns=[*COLUMNS, "consistent"])
    if report is None:
        from servelab.studies.common.study import door

        report = door(study, "report").report
    first = {f.id: f.verdict for f in report(split.campaign).findings}
    second = {f.id: f.verdict for f in report(split.rerun).findings}
    if page is None:
        page = {f.id: f.verdict for f in report(runs).findings}
    named = f"{runs.repeats_name(split.campaign.repeats)} against {runs.repeats_name(split.rerun.repeats)}"
    rows = [
        dict(
            claim=claim,
            campaign=first[claim],
            **{"re-run": second.get(claim, "not judged")},
            page=page.get(claim, ""),
            repeats=named,
        )
        for claim in first
    ]
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["consistent"] = [consistent(a, b) for a, b in zip(out["campaign"], out["re-run"], strict=True)]
    return out


def summary(study: str, table: pd.DataFrame) -> str:
    """One sentence on a study's re-run: how many claims read the same, and which did not."""
    if table.empty:
        return f"{study}: no re-run at this fingerprint yet."
    same = int((table["campaign"] == table["re-run"]).sum())
    settled = int(((table["campaign"] == INCONCLUSIVE) & (table["re-run"] != INCONCLUSIVE)).sum())
    moved = table[~table["consistent"]]
    text = f"{study}: the re-run reads the campaign's verdict for {same} of {len(table)} claims"
    if settled:
        text += f"; it settles {settled} claim{'' if settled == 1 else 's'} the campaign left inconclusive"
    if len(moved):
        text += "; it differs on " + ", ".join(
            f"{r['claim']} ({r['campaign']} → {r['re-run']})" for _, r in moved.iterrows()
        )
    return text + "."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m servelab.studies.common.rerun_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("studies", nargs="+", help="study slugs, e.g. 04_kv_cache")
    ap.add_argument("--results", type=Path, default=None, help="the results root (default: data/results)")
    args = ap.parse_args(argv)
    disagree = 0
    for study in args.studies:
        table = compare(study, study_runs(study, args.results))
        print(summary(study, table))
        if len(table):
            print(table.to_string(index=False))
        disagree += int((~table["consistent"]).sum()) if len(table) else 0
    return 1 if disagree else 0


if __name__ == "__main__":
    raise SystemExit(main())
