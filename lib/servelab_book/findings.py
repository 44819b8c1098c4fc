"""The studies' verdicts on the seed's claims, computed when the book is prepared by each study's reporting path.

For every study (and the simulator page, whose validation judges F2.3) ``study_evidence`` calls
``servelab.studies.common.study.door(slug, "report").report(study_runs(slug))``: today's rules applied to the committed
runs of the study's data (``common/runs.py``), combined over its repeats. No ``findings.csv`` is read: a verdict is
never copied from the file a past run wrote. What the book keeps of each report is a ``StudyEvidence``: the findings,
the study's number for "Against published results" (``report.published_value(runs)``) and how its data stands
against today's measuring code (``RunSet.current`` / ``changed``).

A study whose reporting path is not converted to the measure/report split yet (no ``measure.py`` beside its
``report.py``, or no ``report(runs)``), or whose report fails, reads **inconclusive** for every claim with the reason
(``common.findings.not_measured``); ``prepare`` lists it among its warnings. Only runs on the book's device (a device
folder whose slug contains ``h200``) count: a CPU smoke run never shows up as an H200 value.

The reports run in worker processes (one per core): each study's report is independent, and the whole ``prepare``
stays within about a minute on a 2-core CPU.
"""

from __future__ import annotations

import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root
from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.runs import BOOK_DEVICE  # the book's device: one definition, the studies' pages'
from servelab_book.seed_claims import claim_sort_key
from servelab_book.studies import STUDIES

SIMULATOR = "08_simulator"
# Claims whose verdict comes from a later, better-placed study's report than their own: F2.3 asks whether costs
# measured in isolation predict a server under load, which only the simulator's validation against the real server
# (issue #7) answers. claim id -> the study whose report judges it (its ``f23`` attribute or a finding of that id).
EVIDENCE = {"F2.3": SIMULATOR}
NOT_CONVERTED = "its reporting path is not converted to the measure/report split yet (issue 26)"
FRESH, STALE, NO_DATA = "fresh", "stale", "no data"


class FindingsError(ValueError):
    """Findings that the book cannot show (a claim reported by the wrong study, a duplicate claim)."""


@dataclass(frozen=True)
class StudyEvidence:
    """What the book keeps of one study's report: its findings and how its data stands."""

    slug: str
    findings: tuple[Finding, ...]
    why: str = ""  # why the report did not run ("" when it did)
    measured: bool = False
    current: bool = False  # measured by today's measuring code (same fingerprint)
    fingerprint: str = ""
    changed: tuple[str, ...] = ()  # the measuring files that differ from the data's (stale data)
    repeats: int = 0
    device_name: str = ""
    meta: dict = field(default_factory=dict)  # the first run's run.json
    run_commits: tuple[str, ...] = ()  # every run's commit, in run order
    run_starts: tuple[str, ...] = ()  # every run's start (UTC, ISO), in run order
    published: tuple[str, str] | None = None  # report.published_value(runs)
    has_published: bool = False  # the report defines published_value
    evidence: tuple[Finding, ...] = ()  # claims of other studies this report judges (EVIDENCE)

    @property
    def reported(self) -> bool:
        return not self.why

    @property
    def freshness(self) -> str:
        """fresh (today's measuring code), stale (older code), or no data."""
        if not self.measured:
            return NO_DATA
        return FRESH if self.current else STALE

    @property
    def commit(self) -> str:
        return str(self.meta.get("git_commit") or "")

    @property
    def started_utc(self) -> str:
        return str(self.meta.get("started_utc") or "")


def converted(slug: str) -> bool:
    """The study has both doors: ``measure.py`` and ``report.py`` in its package (checked on disk: importing an
    unconverted study's modules may be slow or fail)."""
    import servelab.studies

    return any(
        (Path(p) / f"s{slug}" / "measure.py").is_file() and (Path(p) / f"s{slug}" / "report.py").is_file()
        for p in servelab.studies.__path__
    )


def _fallback(slug: str, why: str) -> StudyEvidence:
    return StudyEvidence(slug, tuple(not_measured(slug, why)) if slug != SIMULATOR else (), why=why)


def _evidence_of(page) -> tuple[Finding, ...]:
    """The findings a report gives for other studies' claims (``EVIDENCE``): the simulator's ``f23`` attribute, or
    findings of those ids among its ``findings``."""
    found = [getattr(page, "f23", None)] + list(getattr(page, "findings", None) or [])
    keep = {f.id: f for f in found if isinstance(f, Finding) and f.id in EVIDENCE}
    return tuple(keep.values())


def study_page(slug: str, root: Path | None = None, device: str = BOOK_DEVICE):
    """``slug``'s page record over its committed runs on ``device`` (``report.report(runs)``, read back from the
    report cache where the page's render computed it), or why there is none (str): its reporting path not converted
    yet, or its report failed. For the book's pages beside the studies (controlled acceptance, beyond one GPU)."""
    if not converted(slug):
        return NOT_CONVERTED
    from servelab.studies.common.quiet import quiet_run
    from servelab.studies.common.report_cache import cached
    from servelab.studies.common.runs import study_runs
    from servelab.studies.common.study import door

    try:
        with quiet_run():
            runs = study_runs(slug, Path(root or results_root()), device=device)
            mod = door(slug, "report")
            return cached(slug, runs, lambda: mod.report(runs))
    except Exception as e:  # noqa: BLE001 - the page says so; the book builds
        return f"its report failed: {type(e).__name__}: {e}"


def study_evidence(slug: str, root: Path | None = None, device: str = BOOK_DEVICE) -> StudyEvidence:
    """Run ``slug``'s report over its committed runs on ``device``; a not-measured fallback where it cannot."""
    if not converted(slug):
        return _fallback(slug, NOT_CONVERTED)
    from servelab.studies.common.quiet import quiet_run
    from servelab.studies.common.report_cache import cached
    from servelab.studies.common.runs import study_runs
    from servelab.studies.common.study import door

    try:
        with quiet_run():
            runs = study_runs(slug, Path(root) if root else None, device=device)
            mod = door(slug, "report")
            page = cached(slug, runs, lambda: mod.report(runs))  # the page's render computed it: read it back
            has_pub = hasattr(mod, "published_value")
            pub = cached(f"{slug}.published", runs, lambda: mod.published_value(runs)) if has_pub else None
    except Exception as e:  # noqa: BLE001 - one study's broken report must not take the whole book down
        where = traceback.extract_tb(e.__traceback__)[-1]
        at = f"{Path(where.filename).name}:{where.lineno}"
        return _fallback(slug, f"its report failed: {type(e).__name__}: {e} ({at})")
    own = () if slug == SIMULATOR else tuple(getattr(page, "findings", None) or ())
    return StudyEvidence(
        slug,
        own,
        measured=runs.measured,
        current=runs.current,
        fingerprint=runs.fingerprint,
        changed=tuple(runs.changed),
        repeats=len(runs.repeats),
        device_name=runs.device_name if runs.measured else "",
        meta=_with_ceilings(runs),
        run_commits=tuple(r.commit for r in runs.runs),
        run_starts=tuple(str(r.meta.get("started_utc") or "") for r in runs.runs),
        published=pub,
        has_published=has_pub,
        evidence=_evidence_of(page),
    )


def _with_ceilings(runs) -> dict:
    """The first run's ``run.json``, its ceilings those of the first run that measured them: a study's parts that
    measure nothing against a ceiling leave them out (Study 3's controlled sweeps), and its first run may be one."""
    meta = dict(runs.meta)
    if not meta.get("ceilings"):
        meta["ceilings"] = next((r.meta["ceilings"] for r in runs.runs if r.meta.get("ceilings")), {})
    return meta


BOOK_SLUGS = tuple(s.slug for s in STUDIES) + (SIMULATOR,)


def _one(args) -> StudyEvidence:
    slug, root, device = args
    return study_evidence(slug, root, device)


def all_evidence(
    root: Path | None = None, device: str = BOOK_DEVICE, jobs: int | None = None
) -> dict[str, StudyEvidence]:
    """Every study's and the simulator's ``StudyEvidence``, ``jobs`` reports at a time (default: one per core)."""
    root = Path(root or results_root())
    todo = [(s, root, device) for s in BOOK_SLUGS]
    jobs = jobs or max(1, min(len(todo), os.cpu_count() or 1))
    if jobs == 1:
        return {a[0]: _one(a) for a in todo}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(BOOK_SLUGS, pool.map(_one, todo), strict=True))


SHOWN_COLUMNS = [
    "id",
    "claim",
    "seed_value",
    "measured_value",
    "unit",
    "verdict",
    "note",
    "tested_on",
    "repeats",
    "repeat_verdicts",
    "spread",
    "headline_unit",  # the unit of the interval in spread (the headline's, which may differ from the value's)
    "study",
    "source",  # the study whose report judged it (08_simulator for F2.3)
    "freshness",
    "changed",
    "device_name",
    "started_utc",
    "git_commit",
    "runs",  # how many runs the study's verdicts read, and the span of their starts and their commits
    "first_started_utc",
    "last_started_utc",
    "commits",
]


def _row(f: Finding, study: str, ev: StudyEvidence) -> dict:
    return {
        **{k: getattr(f, k) for k in SHOWN_COLUMNS[:12]},
        "study": study,
        "source": ev.slug,
        "freshness": ev.freshness,
        "changed": ", ".join(ev.changed),
        "device_name": ev.device_name,
        "started_utc": ev.started_utc,
        "git_commit": ev.commit,
        **_provenance(ev),
    }


def _provenance(ev: StudyEvidence) -> dict:
    """Every run the study's verdicts read: a study measured over several sessions has runs from several commits,
    and naming the first run's alone (as the findings page did) hid the rest."""
    starts = sorted(t for t in ev.run_starts if t)
    return {
        "runs": len(ev.run_commits),
        "first_started_utc": starts[0] if starts else "",
        "last_started_utc": starts[-1] if starts else "",
        "commits": ", ".join(sorted({c[:7] for c in ev.run_commits if c})),
    }


def book_findings(evidence: dict[str, StudyEvidence]) -> pd.DataFrame:
    """One row per claim any report judged (columns ``SHOWN_COLUMNS``), in claim order; claims judged by another
    study's report (``EVIDENCE``) take that report's row, with the study's own verdict kept in the note."""
    rows = []
    for s in STUDIES:
        ev = evidence.get(s.slug)
        if ev is None:
            continue
        seen = set()
        for f in ev.findings:
            if claim_sort_key(f.id)[0] != s.number:
                raise FindingsError(f"{s.slug}'s report gives claim {f.id}, which belongs to another study")
            if f.id in seen:
                raise FindingsError(f"{s.slug}'s report gives claim {f.id} twice")
            seen.add(f.id)
            rows.append(_row(_judged_elsewhere(f, evidence), s.slug, _source(f, ev, evidence)))
    out = pd.DataFrame(rows, columns=SHOWN_COLUMNS)
    order = sorted(range(len(out)), key=lambda i: claim_sort_key(out["id"].iloc[i]))
    return out.iloc[order].reset_index(drop=True)


def _other(claim: str, evidence: dict[str, StudyEvidence]) -> Finding | None:
    src = evidence.get(EVIDENCE.get(claim, ""))
    return next((f for f in src.evidence if f.id == claim), None) if src is not None else None


def _source(f: Finding, own: StudyEvidence, evidence: dict[str, StudyEvidence]) -> StudyEvidence:
    return evidence[EVIDENCE[f.id]] if _other(f.id, evidence) is not None else own


def _judged_elsewhere(f: Finding, evidence: dict[str, StudyEvidence]) -> Finding:
    """``f``, or the finding another study's report gives for its claim (``EVIDENCE``), keeping the claim and the
    seed's value and noting what the study's own data said."""
    other = _other(f.id, evidence)
    if other is None:
        return f
    # the judging report's note first: the landing table shows a note's first sentence, which must say why the claim
    # reads as it does (F2.3's opens with the simulator's error against its goal, naming the simulator)
    note = (
        f"{other.note.rstrip('.')}. Judged {_judged_by(evidence[EVIDENCE[f.id]])}, not by this study's data, which "
        f"alone said: {f.verdict}, {f.measured_value} {f.unit}."
    )
    return replace(other, claim=f.claim, seed_value=f.seed_value, note=note)


PAGE_NAMES = {SIMULATOR: "the simulator page"}  # the judging reports as the reader knows their pages


def _judged_by(src: StudyEvidence) -> str:
    """Which page's validation judged a claim, and the measuring code of its runs (its Evidence cell's "fresh" or
    "stale")."""
    code = {FRESH: "today's measuring code", STALE: "older measuring code"}.get(src.freshness)
    return f"by {PAGE_NAMES.get(src.slug, src.slug)}'s validation" + (f", its runs measured by {code}" if code else "")


RUN_COLUMNS = [
    "study",
    "device_name",
    "started_utc",
    "git_commit",
    "repeats",
    "freshness",
    "torch",
    "cuda",
    "driver",
    "copy_gb_s",
    "matmul_tflop_s",
    "matmul_dtype",
    "cpu_model",
    "cpu_cores",
    "sm_clock_start_mhz",
    "sm_clock_end_mhz",
]


def run_row(ev: StudyEvidence) -> dict:
    """One row of provenance from a study's first run's ``run.json`` (missing fields become None)."""
    side = ev.meta
    dev, ceil = side.get("device") or {}, side.get("ceilings") or {}
    return {
        "study": ev.slug,
        "device_name": dev.get("name") or ev.device_name,
        "started_utc": side.get("started_utc"),
        "git_commit": side.get("git_commit"),
        "repeats": ev.repeats,
        "freshness": ev.freshness,
        "torch": dev.get("torch"),
        "cuda": dev.get("cuda"),
        "driver": dev.get("driver"),
        "copy_gb_s": ceil.get("copy_gb_s"),
        "matmul_tflop_s": ceil.get("matmul_tflop_s"),
        "matmul_dtype": ceil.get("matmul_dtype"),
        # the host and the SM clocks: None where a record predates them (the page says "not recorded")
        "cpu_model": dev.get("cpu_model"),
        "cpu_cores": dev.get("cpu_cores"),
        "sm_clock_start_mhz": (dev.get("clocks_start") or {}).get("clocks.sm"),
        "sm_clock_end_mhz": (dev.get("clocks_end") or {}).get("clocks.sm"),
    }


def book_runs(evidence: dict[str, StudyEvidence]) -> pd.DataFrame:
    """Provenance of each measured study's runs, one row each in study order (the methodology page's hardware
    table); studies whose report did not run are absent."""
    rows = [run_row(evidence[s.slug]) for s in STUDIES if s.slug in evidence and evidence[s.slug].measured]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)
