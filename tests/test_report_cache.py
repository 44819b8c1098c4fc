"""The report cache (``studies.common.report_cache``): a record is read back only for the same runs, code, data
files and versions; anything else computes afresh."""

import json
import os

import pandas as pd
import pytest

from servelab.studies.common import report_cache
from servelab.studies.common.runs import study_runs

STUDY = "02_gpu_costs"


def _run(root, rep, value):
    from servelab.measure.fingerprint import fingerprint

    fp = fingerprint("servelab.studies.s02_gpu_costs.measure").digest
    d = root / "nvidia-h200" / STUDY / "runs" / fp[:12] / "all" / f"r{rep}"
    d.mkdir(parents=True)
    pd.DataFrame({"v": [value]}).to_csv(d / "steps.csv", index=False)
    meta = dict(part="all", repeat_index=rep, fingerprint=fp, complete=True, device={"name": "NVIDIA H200"})
    (d / "run.json").write_text(json.dumps(meta))
    return d


@pytest.fixture
def on(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVELAB_REPORT_CACHE", "1")
    return tmp_path / "cache"


def test_a_record_is_computed_once_for_one_state(on, tmp_path):
    root = tmp_path / "results"
    _run(root, 0, 1)
    calls = []

    def compute():
        calls.append(1)
        return {"sum": int(study_runs(STUDY, root).table("steps")["v"].sum())}

    runs = study_runs(STUDY, root)
    assert report_cache.cached(STUDY, runs, compute, on) == {"sum": 1}
    assert report_cache.cached(STUDY, study_runs(STUDY, root), compute, on) == {"sum": 1}
    assert len(calls) == 1 and len(list(on.glob("*.pkl"))) == 1


def test_a_new_run_or_an_edited_file_computes_afresh(on, tmp_path):
    root = tmp_path / "results"
    d = _run(root, 0, 1)
    calls = []

    def compute():
        calls.append(1)
        return int(study_runs(STUDY, root).table("steps")["v"].sum())

    assert report_cache.cached(STUDY, study_runs(STUDY, root), compute, on) == 1
    _run(root, 1, 10)
    assert report_cache.cached(STUDY, study_runs(STUDY, root), compute, on) == 11
    pd.DataFrame({"v": [100]}).to_csv(d / "steps.csv", index=False)  # an edit in place, same run folder
    os.utime(d / "steps.csv", ns=(1, 1))
    assert report_cache.cached(STUDY, study_runs(STUDY, root), compute, on) == 110
    assert len(calls) == 3
    assert len(list(on.glob(f"{STUDY}-*.pkl"))) == 1  # earlier states' records are dropped


def test_off_by_default_in_tests_and_off_computes_every_time(tmp_path):
    assert os.environ["SERVELAB_REPORT_CACHE"] == "0"
    root = tmp_path / "results"
    _run(root, 0, 1)
    calls = []
    for _ in range(2):
        report_cache.cached(STUDY, study_runs(STUDY, root), lambda: calls.append(1), tmp_path / "cache")
    assert len(calls) == 2 and not (tmp_path / "cache").exists()


def test_an_unpicklable_record_is_returned_and_not_kept(on, tmp_path):
    root = tmp_path / "results"
    _run(root, 0, 1)
    record = report_cache.cached(STUDY, study_runs(STUDY, root), lambda: lambda: 1, on)
    assert record() == 1 and not list(on.glob("*.pkl")) and not list(on.glob("*.tmp"))
