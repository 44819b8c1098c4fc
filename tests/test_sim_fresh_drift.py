"""The fresh held-out run's page says when the server it measured is not the one the frozen model was fitted to."""

import pandas as pd

from servelab.studies.s08_simulator import freeze_record, fresh_drift


def _table(real_ms: float, sim_ms: float) -> pd.DataFrame:
    rows = [{"model": "config:qwen2-0.5b", "metric": "p50 ITL", "real": real_ms, "sim": sim_ms, "error_pct": 0.0}] * 3
    return pd.DataFrame(rows + [{"model": "config:qwen2-0.5b", "metric": "p99 TTFT", "real": 9.0, "sim": 9.0}])


def test_the_calibration_runs_itl_is_read_from_the_frozen_runs_requests():
    rec = freeze_record.load_freeze()
    cal = fresh_drift.calibration_metric(rec)
    # the committed freeze's Study 1 repeat (66a2529, fingerprint 94c0bf13c028): a qwen2-0.5b p50 ITL of 1-3 ms, an
    # 8B one of 5-12 ms (the freeze before it, on the run at 1b233dd, read 4-7 and 10-16 ms)
    assert set(cal.index) == {"config:qwen2-0.5b", "config:llama-3-8b"}
    assert 1.0 < cal["config:qwen2-0.5b"] < 3.0 and 5.0 < cal["config:llama-3-8b"] < 12.0
    assert fresh_drift.calibration_metric({"calibration": {"study1": []}}).empty


def test_a_server_that_changed_under_the_frozen_model_is_named(monkeypatch):
    monkeypatch.setattr(fresh_drift, "calibration_metric", lambda *a, **k: pd.Series({"config:qwen2-0.5b": 6.0}))
    moved = fresh_drift.drift(_table(1.6, 6.1), {})
    assert moved["changed"].tolist() == [True] and round(float(moved["ratio"].iat[0]), 2) == 0.27
    text = fresh_drift.text(moved, "1b233dd8", ["50ec9603", "50ec9603"])
    assert "6.0 ms in the calibration runs, 1.6 ms real and 6.1 ms simulated" in text
    assert "at 1b233dd against the fresh runs at 50ec960" in text and "frozen on another server" in text
    same = fresh_drift.drift(_table(5.5, 6.1), {})
    assert same["changed"].tolist() == [False] and "another server" not in fresh_drift.text(same, "1b233dd8", [])
    # no calibration runs to compare with: nothing said
    monkeypatch.setattr(fresh_drift, "calibration_metric", lambda *a, **k: pd.Series(dtype=float))
    assert fresh_drift.text(fresh_drift.drift(_table(1.6, 6.1), {}), "x", []) == ""


def test_the_f23_note_names_a_changed_server_beside_the_fresh_error(monkeypatch):
    from servelab.studies.common.findings import Finding
    from servelab.studies.s08_simulator import report

    monkeypatch.setattr(fresh_drift, "calibration_metric", lambda *a, **k: pd.Series({"config:qwen2-0.5b": 6.0}))
    f = Finding(
        id="F2.3", claim="c", seed_value="holds", measured_value="6.6", unit="%", verdict="inconclusive", note="n"
    )
    fresh = {"median_abs_error_pct": 66.8, "runs": 26, "per_repeat": {47: 67.7, 48: 66.0}}
    moved = report._with_fresh(f, {**fresh, "drift": fresh_drift.drift(_table(1.6, 6.1), {})})
    assert "66.8 % over 26 runs in 2 repeats (the server changed" in moved.note
    assert "qwen2-0.5b p50 ITL 6.0 → 1.6 ms" in moved.note
    same = report._with_fresh(f, {**fresh, "drift": fresh_drift.drift(_table(5.5, 6.1), {})})
    assert same.note.endswith("in 2 repeats")
