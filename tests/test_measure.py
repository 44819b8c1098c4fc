import json

import pandas as pd
import pytest

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.device import sdpa_priority_order, slugify
from servelab.measure.results import StudyResults, findings_frame, load_results


def test_roofline_floor_bound_and_percent():
    r = Roofline(matmul_tflop_s=100.0, copy_gb_s=1000.0)
    # 1e12 FLOPs at 100 TFLOP/s = 10 ms; 1e9 bytes at 1000 GB/s = 1 ms
    assert r.floor_ms(1e12, 1e9) == pytest.approx(10.0)
    assert r.bound(1e12, 1e9) == "compute"
    assert r.bound(1e6, 1e10) == "memory"
    assert r.pct_of_floor(20.0, 1e12, 1e9) == pytest.approx(50.0)
    assert r.achieved_gb_s(1.0, 1e9) == pytest.approx(1000.0)
    assert r.achieved_tflop_s(10.0, 1e12) == pytest.approx(100.0)


def test_device_record_on_cpu_has_versions_and_sdpa_order():
    d = device_record("cpu")
    assert d.kind == "cpu" and d.slug == "cpu"
    assert d.torch and d.transformers and d.python
    order = sdpa_priority_order()
    assert {"flash_attention", "efficient_attention", "math"} <= set(order)
    assert d.sdpa_priority == order
    assert "torch" in d.summary()


def test_slug_of_h200_contains_h200():
    assert "h200" in slugify("NVIDIA H200")
    assert slugify("NVIDIA H200") == "nvidia-h200"


def test_ceilings_on_cpu_are_positive_and_consistent():
    c = measure_ceilings("cpu", copy_mib=8, matmul_n=128, repeats=3)
    assert c.copy_gb_s > 0 and c.matmul_tflop_s > 0
    assert c.copy_bytes == 2 * 8 * 2**20
    assert c.ridge_flop_per_byte == pytest.approx(c.matmul_tflop_s * 1e12 / (c.copy_gb_s * 1e9))


def test_study_results_write_csv_sidecar_and_findings(scratch_results):
    dev = device_record("cpu")
    res = StudyResults("99_test", dev, {"profile": "smoke", "n": 3})
    res.write("steps", pd.DataFrame({"a": [1, 2]}))
    res.write_findings(
        [dict(id="F9.1", claim="c", seed_value="1", measured_value="2", unit="ms", verdict="changes", note="n")]
    )
    res.finish()
    side = json.loads((res.dir / "run.json").read_text())
    assert res.dir == scratch_results / "cpu" / "99_test"
    assert side["params"] == {"profile": "smoke", "n": 3}
    assert side["device"]["slug"] == "cpu" and side["git_commit"]
    assert set(side["files"]) == {"steps.csv", "findings.csv"}
    assert load_results("99_test", "steps")["a"].tolist() == [1, 2]


def test_study_results_write_for_another_study(scratch_results):
    dev = device_record("cpu")
    with pytest.raises(FileNotFoundError, match="01_x"):  # no such study's results yet: nothing to add to
        StudyResults("08_y", dev, {}).write_for("01_x", "sim_validation", pd.DataFrame({"a": [1]}))
    StudyResults("01_x", dev, {}).write("requests", pd.DataFrame({"a": [0]}))
    res = StudyResults("08_y", dev, {})
    path = res.write_for("01_x", "sim_validation", pd.DataFrame({"a": [1]}))
    assert path == scratch_results / "cpu" / "01_x" / "sim_validation.csv"
    assert load_results("01_x", "sim_validation")["a"].tolist() == [1]
    assert json.loads((res.dir / "run.json").read_text())["files"] == ["01_x/sim_validation.csv"]
    with pytest.raises(ValueError, match="alphanumeric"):
        res.write_for("../01_x", "v", pd.DataFrame())


def test_findings_reject_bad_verdicts_and_missing_columns():
    with pytest.raises(ValueError, match="verdict"):
        findings_frame([dict(id="F1", claim="c", seed_value="", measured_value="", unit="", verdict="maybe", note="")])
    with pytest.raises(ValueError, match="columns"):
        findings_frame([dict(id="F1", verdict="holds")])


def test_git_commit_prefers_the_run_scripts_revision(monkeypatch):
    from servelab.measure.results import git_commit

    monkeypatch.setenv("SERVELAB_REVISION", "abc123")
    assert git_commit() == "abc123"
    monkeypatch.delenv("SERVELAB_REVISION")
    assert git_commit() != "abc123"


def test_host_record_names_the_cpu_model_and_cores(tmp_path):
    from servelab.measure.device import cpu_cores, cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654  96-Core Processor\n")
    assert cpu_model(str(info)) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(str(tmp_path / "absent")) != ""  # falls back to what platform reports
    d = device_record("cpu")
    assert d.cpu_cores == cpu_cores() and d.cpu_cores >= 1
    assert d.cpu_model and d.host().startswith(d.cpu_model) and f"{d.cpu_cores} cores" in d.host()
    assert {"cpu_model", "cpu_cores", "clocks_start", "clocks_end"} <= set(d.as_dict())
