"""scripts/gpu_run.sh refuses jobs on a GPU that is not the book's device: the device tool lends H100s as well as
H200s, and a run on an H100 lands in a folder no page reads. Run with stub ``nvidia-smi`` and ``python3`` on PATH,
from a scratch snapshot folder, so nothing is installed or measured."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from servelab.studies.common.runs import BOOK_DEVICE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_run.sh"


def run_script(tmp_path: Path, gpu: str, **env) -> tuple[subprocess.CompletedProcess, Path]:
    stubs, snap, out = tmp_path / "bin", tmp_path / "snap", tmp_path / "out"
    for d in (stubs, snap / ".whl", out):
        d.mkdir(parents=True, exist_ok=True)
    (snap / ".whl" / "stub-0-py3-none-any.whl").write_text("")  # the wheel install is the first step past the check
    marker = tmp_path / "python3-ran"
    (stubs / "nvidia-smi").write_text(f"#!/bin/sh\necho '{gpu}'\n")
    (stubs / "python3").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")  # any python3 call: past the check
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "SERVELAB_ANY_GPU"}  # only the test's own override counts
    env = base | {"PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(out), "SERVELAB_SNAPSHOT": str(snap)} | env
    proc = subprocess.run(
        ["bash", str(SCRIPT), "02_gpu_costs:all:0"], env=env, capture_output=True, text=True, timeout=60
    )
    return proc, marker


def test_the_scripts_device_is_the_books():
    assert f"BOOK_GPU={BOOK_DEVICE.upper()}\n" in SCRIPT.read_text()


def test_jobs_on_another_gpu_are_refused_before_anything_runs(tmp_path):
    proc, marker = run_script(tmp_path, "NVIDIA H100 80GB HBM3")
    assert proc.returncode == 3, proc.stderr
    assert "refused: this GPU is 'NVIDIA H100 80GB HBM3', not the book's H200" in proc.stdout
    assert not marker.exists()  # no wheel installed, no job started
    assert "refused" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.parametrize("gpu, env", [("NVIDIA H200", {}), ("NVIDIA H100 80GB HBM3", {"SERVELAB_ANY_GPU": "1"})])
def test_the_books_gpu_or_an_explicit_override_goes_on(tmp_path, gpu, env):
    proc, marker = run_script(tmp_path, gpu, **env)
    assert marker.exists() and "refused" not in proc.stdout  # on to the wheel install (the stub fails it)
    assert proc.returncode == 1 and "wheel install failed" in proc.stdout
