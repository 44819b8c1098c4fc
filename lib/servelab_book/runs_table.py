"""The methodology page's hardware table: the device, versions and ceilings of each study's H200 runs.

The ceilings (copy bandwidth, matmul rate) are the ones each study measured in the first of its runs that measured
them (a part that judges nothing against a ceiling skips them); they are read from
the ``run.json`` of the runs its report read (``findings.book_runs``), never typed. Each row also says how many
repeats the study's data holds and whether today's measuring code measured it (fresh) or older code (stale). Given
the studies' evidence (``findings.StudyEvidence``), a row names every run its report read: how many, when the first
and the last started, and every commit they ran at; without it, the first run's start and commit.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.markdown import format_value, md_text
from servelab_book.findings_table import format_utc
from servelab_book.studies import study_by_slug


def run_history(evidence: dict | None) -> dict[str, str]:
    """Per study slug: "28 runs, 2026-12-04 05:45 UTC → 2026-12-06 06:07 UTC" from the evidence's run starts."""
    out = {}
    for slug, ev in (evidence or {}).items():
        starts = sorted(s for s in getattr(ev, "run_starts", ()) if s)
        if not starts:
            continue
        n = len(ev.run_starts)
        first, last = format_utc(starts[0]), format_utc(starts[-1])
        out[slug] = f"{n:,} run{'s' if n != 1 else ''}, " + (first if first == last else f"{first} → {last}")
    return out


def run_commits(evidence: dict | None) -> dict[str, str]:
    """Per study slug: every commit its runs ran at, short and in first-seen order."""
    return {
        slug: ", ".join(f"`{c}`" for c in dict.fromkeys(str(c)[:7] for c in ev.run_commits if c))
        for slug, ev in (evidence or {}).items()
        if getattr(ev, "run_commits", ())
    }


def render_runs_table(runs: pd.DataFrame, evidence: dict | None = None) -> str:
    """A MyST table of the runs (``findings.book_runs``), or a sentence saying there are none yet; ``evidence``
    (``findings.all_evidence``) adds every run's starts and commits, else the first run's are shown."""
    if runs.empty:
        return (
            "No study has been run on the H200 yet, so no ceilings are recorded here: each study page "
            "prints the ceilings it measured in its own run once it is executed.\n"
        )
    header = [
        "Study",
        "Device",
        "Runs (first → last start)" if evidence else "Run started",
        "Commits" if evidence else "Commit",
        "Repeats",
        "Data",
        "torch / CUDA / driver",
        "Host CPU",
        "SM clock, start → end (MHz)",
        "Copy (GB/s), first run that measured it",
        "Matmul (TFLOP/s), same run",
    ]
    history, commits = run_history(evidence), run_commits(evidence)
    lines = [":::{list-table}", ":header-rows: 1", ":class: servelab-runs", "", "* - " + "\n  - ".join(header)]
    for r in runs.itertuples():
        study = study_by_slug(r.study)
        cells = [
            f"{{doc}}`Study {study.number} </{study.docname}>`",
            md_text(r.device_name or "?"),
            md_text(history.get(r.study) or (format_utc(r.started_utc) if r.started_utc else "?")),
            commits.get(r.study) or (f"`{str(r.git_commit)[:7]}`" if r.git_commit else "?"),
            str(r.repeats),
            md_text(r.freshness),
            md_text(f"{r.torch} / {r.cuda} / {r.driver}"),
            md_text(host_cpu(r.cpu_model, r.cpu_cores)),
            md_text(sm_clocks(r.sm_clock_start_mhz, r.sm_clock_end_mhz)),
            _num(r.copy_gb_s),
            _num(r.matmul_tflop_s) + (f" ({md_text(r.matmul_dtype)})" if r.matmul_dtype else ""),
        ]
        lines.append("* - " + "\n  - ".join(cells))
    lines.append(":::")
    return "\n".join(lines) + "\n"


NOT_RECORDED = "not recorded"


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and pd.isna(x)) or str(x).strip() in ("", "[N/A]", "N/A")


def host_cpu(model, cores) -> str:
    """The model and cores ("AMD EPYC 9654 96-Core Processor, 16 cores"); "not recorded" for a run older than
    the host record."""
    if _missing(model):
        return NOT_RECORDED
    return f"{model}, {int(cores)} cores" if not _missing(cores) else str(model)


def sm_clocks(start, end) -> str:
    """The SM clock at start and end ("1,980 → 1,980"); a side the record lacks reads "not recorded"."""
    shown = [NOT_RECORDED if _missing(x) else format_value(str(x)) for x in (start, end)]
    return NOT_RECORDED if shown[0] == shown[1] == NOT_RECORDED else " → ".join(shown)


def _num(x) -> str:
    return "?" if x is None or pd.isna(x) else md_text(format_value(str(x)))
