"""``scripts/probe_compile_check.py`` runs through on a CPU (tiny model, no compile), so a GPU call never spends its
minutes on a script that breaks: bf16 against float32 on the same weights is close but not equal, and the device
record lands beside the CSV."""

import json
import os
import subprocess
import sys

import pandas as pd

from servelab.paths import REPO_ROOT


def test_a_cpu_run_compares_bf16_with_float32_and_writes_the_device_record(tmp_path):
    out = tmp_path / "compile_check.csv"
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "probe_compile_check.py"), "--device", "cpu", "--no-compile"]
        + ["--models", "config:tiny-llama", "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    row = pd.read_csv(out).set_index("a").loc["bf16 eager"]
    assert row["b"] == "float32 eager"
    assert 0 < row["rms_rel"] < 0.05 and 0 < row["max_abs"] < row["ref_max_abs"]
    assert json.loads(out.with_suffix(".device.json").read_text())["device"]
