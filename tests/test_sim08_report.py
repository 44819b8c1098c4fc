"""The simulator page's two doors: the measuring path's closure, and the report from files (empty, synthetic)."""

from __future__ import annotations

import json

import pandas as pd

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s08_simulator import report, sections

STUDY = "08_simulator"


def test_measure_closure_has_no_reporting_module():
    files = fingerprint("servelab.studies.s08_simulator.measure").files
    bad = [f for f in files if any(w in f for w in ("plots", "report", "verdicts", "page", "sections", "takeaways"))]
    bad += [f for f in files if "servelab_book" in f or "studies/common/runs" in f or "studies/common/study" in f]
    assert bad == []
    assert "lib/servelab/studies/s08_simulator/freeze.py" in files  # the code hash it records


def test_report_on_nothing_is_not_measured():
    page = report.report(RunSet(STUDY))
    assert [f.id for f in page.findings] == ["F2.3"]
    assert page.findings[0].verdict == "inconclusive" and "Not measured" in page.findings[0].note
    assert page["sim_validation"].empty and not page.speed and not page.fresh
    assert report.published_value(RunSet(STUDY)) is None
    assert "Not measured" in sections.heldout_text(page)


def _speed_run(root, hour_wall_s: float):
    d = root / "nvidia-h200" / STUDY / "runs" / "abc123abc123" / "speed" / "r0"
    d.mkdir(parents=True)
    row = dict(rate=100.0, replicas=8, router="least_outstanding", scheduler="chunked_prefill", simulated_s=3600.0,
               requests=360000, steps=4500000, wall_s=hour_wall_s, cpu_s=hour_wall_s, sim_requests_per_s=360000 /
               hour_wall_s, sim_steps_per_s=1.0, hour_wall_s=hour_wall_s, hour_extrapolated=False, goal_s=60.0,
               meets_goal=hour_wall_s <= 60, completed=360000, ttft_p99_ms=70.0, lengths="x")  # fmt: skip
    pd.DataFrame([row]).to_csv(d / "sim_speed.csv", index=False)
    dev = {"name": "NVIDIA H200", "slug": "nvidia-h200", "kind": "cuda"}
    meta = {"study": STUDY, "fingerprint": "abc123abc123", "part": "speed", "repeat_index": 0, "complete": True,
            "device": dev, "params": {"seed": 0}}  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))
    return d


def test_report_reads_the_measured_speed_and_nothing_else(tmp_path):
    d = _speed_run(tmp_path, 38.0)
    runs = study_runs(STUDY, tmp_path)
    page = report.report(runs)
    assert page.speed["hour_wall_s"] == 38.0 and "within" in sections.tk.speed(page)
    # no Study 1 under this root: nothing to calibrate on, F2.3 not measured, no crash
    assert page.findings[0].verdict == "inconclusive" and page["sim_validation"].empty
    assert "Not measured" in sections.heldout_text(page)
    # the acceptance check: a number in the raw CSV moves what the page says
    s = pd.read_csv(d / "sim_speed.csv").assign(hour_wall_s=75.0)
    s.to_csv(d / "sim_speed.csv", index=False)
    page = report.report(study_runs(STUDY, tmp_path))
    assert page.speed["hour_wall_s"] == 75.0 and "over" in sections.tk.speed(page)
