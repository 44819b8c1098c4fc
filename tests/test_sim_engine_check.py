"""A fresh held-out run is held back where Study 1's engine is not the one the freeze calibrated on
(``s08_simulator.measure.engine_check``): its error would measure the engine's change as well as the model's."""

import json
from types import SimpleNamespace

import servelab.measure.fingerprint as fingerprint_module
from servelab.studies.s08_simulator import measure


def _freeze(root, fingerprints):
    inputs = {f"data/results/nvidia-h200/01_scheduling/runs/{fp}/qwen-fcfs/r0/steps.csv.xz": "0" for fp in fingerprints}
    (root / "sim_freeze.json").write_text(json.dumps({"frozen_utc": "x", "calibration_inputs": inputs}))


def test_the_engine_check_compares_study1s_fingerprint_with_the_calibration_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint_module, "fingerprint", lambda module: SimpleNamespace(short="aaaa00000000"))
    _freeze(tmp_path, ["aaaa00000000"])
    assert measure.engine_check(tmp_path) == {
        "study1_fingerprint": "aaaa00000000",
        "calibrated_on": ["aaaa00000000"],
        "matches": True,
    }
    _freeze(tmp_path, ["bbbb00000000"])
    assert not measure.engine_check(tmp_path)["matches"]
    _freeze(tmp_path, ["aaaa00000000", "bbbb00000000"])  # calibrated on two engines: no one engine to test
    assert not measure.engine_check(tmp_path)["matches"]


def test_fresh_parts_are_held_back_on_another_engine_and_other_parts_never(monkeypatch):
    monkeypatch.setattr(measure, "freeze_check", lambda: {"matches_freeze": True, "changed_files": []})
    monkeypatch.setattr(
        measure, "engine_check", lambda: {"study1_fingerprint": "new", "calibrated_on": ["old"], "matches": False}
    )
    why = measure.held_back("fresh_qwen2-0.5b")
    assert "Study 1's engine (new)" in why and "(old)" in why and "gpu_snapshot.sh" in why
    assert measure.held_back("speed") == ""
    monkeypatch.setattr(measure, "engine_check", lambda: {"matches": True})
    assert measure.held_back("fresh_llama-3-8b") == ""
