"""``scripts/gc_pause.py`` runs through on a CPU with a tiny model, so the GPU call that runs it never spends its
minutes on a script that breaks: it writes one row a stage, a built engine leaves more objects to the collector than
the imports alone, and freezing the heap takes them out of its view."""

import os
import subprocess
import sys

import pandas as pd

from servelab.paths import REPO_ROOT


def test_the_script_times_each_stage_and_the_freeze_empties_the_collectors_view(tmp_path):
    out = tmp_path / "gc_pause.csv"
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gc_pause.py"), "--spec", "config:tiny-qwen2", "--device", "cpu",
         "--compile", "off", "--repeats", "1", "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = pd.read_csv(out).set_index("stage")
    assert list(rows.index) == ["imports", "engine built and warmed up", "the same after gc.freeze()"]
    assert rows.loc["engine built and warmed up", "objects"] > rows.loc["imports", "objects"]
    assert rows.loc["the same after gc.freeze()", "objects"] < rows.loc["imports", "objects"] / 10
    assert (rows["full_collection_ms"] >= 0).all()
