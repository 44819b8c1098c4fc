"""scripts/gpu_dev.sh runs each development task it is given under its own limit, logs it to ``$OUT`` and says
how it ended; an unknown task ends the script with exit 2. Run with stub ``nvidia-smi`` and ``python3`` on PATH,
so nothing is measured: the stub records the command line it was given."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_dev.sh"


def run_dev(tmp_path: Path, *tasks: str) -> tuple[subprocess.CompletedProcess, Path]:
    stubs, out = tmp_path / "bin", tmp_path / "out"
    stubs.mkdir()
    calls = tmp_path / "calls"
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 1980 MHz, 81559 MiB'\n")
    (stubs / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho stub output\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = os.environ | {"PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(out)}
    proc = subprocess.run(["bash", str(SCRIPT), *tasks], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return proc, calls


def test_each_task_runs_its_command_and_is_summarised(tmp_path):
    proc, calls = run_dev(tmp_path, "staged", "small-linear", "decode-kernel")
    assert proc.returncode == 0, proc.stderr
    ran = calls.read_text().splitlines()
    assert "tests/test_small_linear.py" in ran[0] and "tests/test_speculative_ngram.py" in ran[0]
    assert "scripts/bench_small_linear.py" in ran[1] and "--sweep" in ran[1]
    assert "scripts/bench_decode_kernel.py" in ran[2]
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["staged", "small-linear", "decode-kernel"]
    assert all("exit 0" in line for line in summary)
    assert (tmp_path / "out" / "small-linear.log").read_text() == "stub output\n"
    assert "NVIDIA H100" in (tmp_path / "out" / "gpu.txt").read_text()


def test_an_unknown_task_ends_the_script(tmp_path):
    proc, _ = run_dev(tmp_path, "staged", "no-such-task", "decode-kernel")
    assert proc.returncode == 2
    assert "unknown task 'no-such-task'" in (tmp_path / "out" / "summary.txt").read_text()


def test_host_stalls_runs_study_1s_qwen_parts_under_the_probe_then_reads_them(tmp_path):
    proc, calls = run_dev(tmp_path, "host-stalls")
    assert proc.returncode == 0, proc.stderr
    ran = [line for line in calls.read_text().splitlines() if " pip " not in f" {line} "]
    assert "scripts/gc_pause.py" in ran[0]
    assert "servelab.studies.common.campaign run" in ran[1]
    assert "01_scheduling:qwen-eager-chunked512:0" in ran[1] and "01_scheduling:qwen-fcfs-chunked2048:0" in ran[1]
    assert "scripts/host_stalls.py" in ran[2] and "--probe" in ran[2]
    assert "host-stalls: exit 0" in (tmp_path / "out" / "summary.txt").read_text()
