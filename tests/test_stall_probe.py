"""The stall probe (``scripts/stall_probe/sitecustomize.py``) and its reader (``scripts/host_stalls.py``) work on a
CPU, so the GPU call that runs them (``scripts/gpu_dev.sh host-stalls``) never spends its minutes on a probe that
records nothing or a reader that cannot join it: a process with a large heap collects it inside a known window, and
the reader puts that collection on the step whose window it is. Without ``SERVELAB_STALL_PROBE`` the probe does
nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd

from servelab.paths import REPO_ROOT

PROBE_DIR = REPO_ROOT / "scripts" / "stall_probe"

# a heap of 400k tracked objects whose full collection is timed from the inside: the window a step would have
CHILD = """
import gc, json, time
heap = [[i] for i in range(400_000)]
time.sleep(0.3)  # the probe's hook thread and sampler are up
t0 = time.perf_counter()
gc.collect()
t1 = time.perf_counter()
time.sleep(2.5)  # one flush of the probe's buffer
print(json.dumps({"t0": t0, "t1": t1}))
"""


def _child(tmp_path, probe: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{PROBE_DIR}{os.pathsep}{REPO_ROOT / 'lib'}"}
    env.pop("SERVELAB_STALL_PROBE", None)
    if probe:
        env["SERVELAB_STALL_PROBE"] = str(tmp_path / "p")
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_without_its_variable_the_probe_writes_nothing(tmp_path):
    _child(tmp_path, probe=False)
    assert list(tmp_path.iterdir()) == []


def test_a_collection_inside_a_step_is_put_on_that_step(tmp_path):
    w = _child(tmp_path, probe=True)
    files = list(tmp_path.glob("p.*.jsonl"))
    assert len(files) == 1
    kinds = {json.loads(line)["kind"] for line in files[0].read_text().splitlines()}
    assert {"process", "gc", "stack", "stacks"} <= kinds
    # two steps on one point's axis: the one whose host time covers the collection, and one long before it
    t_origin = w["t0"] - 10.0
    held_ms = (w["t1"] - w["t0"]) * 1e3 + 1.0
    point = {"scheduler": "chunked_prefill", "budget": 512, "rate_fraction": 0.3, "device_ms": 1.0}
    steps = pd.DataFrame(
        [
            {**point, "t0_perf_s": t_origin, "start_s": 10.0, "host_ms": held_ms},
            {**point, "t0_perf_s": t_origin, "start_s": 1.0, "host_ms": held_ms},
        ]
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    steps.to_csv(run_dir / "steps.csv", index=False)
    out = tmp_path / "stalls.csv"
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "host_stalls.py"), str(run_dir), "--probe", str(tmp_path / "p"),
         "--min-ms", "0", "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib")},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    table = pd.read_csv(out).sort_values("start_s")
    assert table["events"].tolist()[0] == "none"
    assert "gc gen 2" in table["events"].tolist()[1]
    # the collection fills the step's window, less the millisecond added around it
    assert table["event_ms"].tolist()[1] >= 0.9 * (held_ms - 1.0)
