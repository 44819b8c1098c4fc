"""Study 1 end to end, as its notebook runs it: the machine's record and ceilings, the sweep, the results written,
the verdicts. One call (``run``), so that the notebook holds parameters, this call, figures and findings only.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import pandas as pd

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.findings import Finding
from servelab.studies.common.quiet import quiet_run
from servelab.studies.common.style import use_book_style
from servelab.studies.s01_scheduling import verdicts
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.sizing import label
from servelab.studies.s01_scheduling.sweep import run_study, workload_lengths

STUDY = "01_scheduling"
PARTS_DIR = "01_scheduling_parts"  # a run of some ``parts`` writes to <device>/01_scheduling_parts/<label>/


def results_name(P: dict) -> str:
    """The results folder of a run under the device's: the study's, or its part's (``merge`` joins the parts)."""
    return STUDY if P.get("parts") is None else f"{PARTS_DIR}/{label(P['parts'])}"


TABLES = ("requests", "steps", "summary", "probes", "servers")  # the sweep's frames written as CSVs, if not empty


@dataclass
class Study1Run:
    P: dict
    dev: object  # servelab.measure.DeviceRecord
    ceilings: object  # servelab.measure.Ceilings
    frames: dict[str, pd.DataFrame]  # TABLES, as ``StudyData.frames`` returns them
    capacity: pd.DataFrame  # capacity_table(summary)
    findings: list[Finding]
    workload: str  # where the request lengths come from
    log: list[str] = field(default_factory=list)  # the sweep's messages (probe results, skipped points, errors)
    results_dir: object = None

    @property
    def summary(self) -> pd.DataFrame:
        return self.frames["summary"]

    @property
    def mid_fraction(self) -> float:
        """The middle rate fraction of the sweep, where the latency figures compare the policies."""
        fr = self.P["rate_fractions"]
        return fr[len(fr) // 2]


def run(P: dict) -> Study1Run:
    """Measure the machine, run the sweep (``sweep.run_study``, quietly), write every table and the findings.

    Library warnings that say nothing about the measurement are filtered (``common.quiet``).
    """
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    with quiet_run():
        return _run(P)


def _run(P: dict) -> Study1Run:
    dev = device_record()
    ceil = measure_ceilings()
    res = StudyResults(results_name(P), dev, P, ceil)
    log: list[str] = []
    data = run_study(
        P,
        tempfile.mkdtemp(prefix="study01-"),
        device="cuda" if dev.kind == "cuda" else "cpu",
        roofline=Roofline.from_ceilings(ceil),
        progress=False,
        log=log.append,
    )
    frames = data.frames()
    capacity = capacity_table(frames["summary"])
    for name in TABLES:
        if not frames[name].empty:
            res.write(name, frames[name])
    res.write("capacity", capacity)
    findings = verdicts.findings(frames["summary"], P["reference_budget"], P["dtype"])
    res.write_findings([f.row() for f in findings])
    res.finish()
    return Study1Run(P, dev, ceil, frames, capacity, findings, workload_lengths(P).source, log, res.dir)


def load(folder) -> Study1Run:
    """A ``Study1Run`` from written results (``merge``'s joined parts, or any run's folder), for a page built from
    runs made elsewhere: the tables as written, the findings recomputed from the summary by today's rules (a summary
    that predates the p99 stall gains it from its requests, ``stall.with_stall_stats``)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from servelab.paths import DATA_DIR
    from servelab.studies.s01_scheduling.stall import with_stall_stats

    folder = Path(folder) if Path(folder).is_dir() else DATA_DIR.parent / folder  # papermill runs in notebooks/
    side = json.loads((folder / "run.json").read_text())
    P = side["params"]
    frames = {}
    for name in TABLES:
        path = folder / f"{name}.csv"
        frames[name] = pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()
    if not frames["summary"].empty and not frames["requests"].empty:
        frames["summary"] = with_stall_stats(frames["summary"], frames["requests"])
    capacity = capacity_table(frames["summary"])
    findings = verdicts.findings(frames["summary"], P["reference_budget"], P["dtype"])
    dev = SimpleNamespace(**side["device"])  # name, slug …: what the page shows of the device
    return Study1Run(P, dev, side.get("ceilings"), frames, capacity, findings, workload_lengths(P).source, [], folder)
