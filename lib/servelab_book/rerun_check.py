"""The methodology page's re-run check: for each study re-run at its fingerprint, its campaign's verdicts against the
re-run's (``servelab.studies.common.rerun_check``); where none is, what a re-run would cost and the command that
lists its jobs. Every verdict and minute here comes from the committed runs and the plan's estimates, never typed.
"""

from __future__ import annotations

from pathlib import Path

from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.common.repeats import MIN_REPEATS
from servelab.studies.common.rerun_check import RERUN_REPEATS
from servelab_book.studies import STUDIES, study_by_slug

CSS = "servelab-rerun"


def _verdict(v: str) -> str:
    return f"**{v}**" if v else "—"


def _study_table(slug: str, table) -> str:
    study = study_by_slug(slug)
    header = ["Claim", "Campaign", "Re-run", "Page (every repeat)", "Consistent"]
    rows = [
        [
            r["claim"],
            _verdict(r["campaign"]),
            _verdict(r["re-run"]),
            _verdict(r["page"]),
            "yes" if r["consistent"] else "**no**",
        ]
        for _, r in table.iterrows()
    ]
    return f"**Study {study.number}, {md_text(study.title)}** ({md_text(table['repeats'].iloc[0])}):\n\n" + list_table(
        header, rows, [10, 20, 20, 25, 15], css=CSS
    )


def _cheapest(results: Path | None) -> str:
    """The re-run the plan prices lowest (``rerun_check.rerun_jobs``), as a sentence with the command."""
    from servelab.studies.common.campaign import rerun_jobs

    jobs = rerun_jobs(results)
    if not jobs:
        return ""
    study = study_by_slug(jobs[0].study)
    return (
        f" The cheapest, by the plan's estimates from its recorded runs, is Study {study.number} "
        f"({md_text(study.title)}): {len(jobs)} jobs, about {sum(j.minutes for j in jobs):.1f} min of H200 time, "
        f"which `make gpu-plan` lists (alone: `make gpu-plan REPEATS={RERUN_REPEATS} STUDIES={study.slug}`)."
    )


def render_rerun_check(evidence: dict, results: Path | None = None, device: str | None = None) -> str:
    """Markdown: every re-run study's table, or why there is none yet and what the cheapest would cost."""
    from servelab.studies.common.rerun_check import compare, summary
    from servelab.studies.common.runs import study_runs

    parts = []
    for s in STUDIES:
        ev = evidence.get(s.slug)
        if ev is None or not ev.measured or ev.repeats < RERUN_REPEATS:
            continue
        runs = study_runs(s.slug, results, device=device)
        table = compare(s.slug, runs, page={f.id: f.verdict for f in ev.findings})
        if len(table):
            parts.append(md_text(summary(f"Study {s.number}", table)) + "\n\n" + _study_table(s.slug, table))
    if parts:
        return "\n\n".join(parts) + "\n"
    return (
        f"No study has been re-run yet: each holds the campaign's {MIN_REPEATS} repeats at its fingerprint, so no "
        f"second set of {MIN_REPEATS} stands beside them to judge on its own." + _cheapest(results) + "\n"
    )
