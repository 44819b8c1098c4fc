"""Run a check under Triton's interpreter (``TRITON_INTERPRET=1``) in a fresh interpreter.

The variable must be set before Triton is first imported, and the test process has already imported it for the
compiled paths; so the check runs as ``python -c CODE`` with the repository's ``lib``, root and ``tests`` on the
path, and passes when it exits 0 and its last line is ``ok``. ``run_script_interpreted`` runs a script of
``scripts/`` the same way (a benchmark's ``--smoke`` run on a CPU) and passes when it exits 0.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return {
        **os.environ,
        "TRITON_INTERPRET": "1",
        # tests/ too: a check that imports a test module (``tests.test_x``) gets that module's own imports
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "lib"), str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
    }


def run_interpreted(code: str, timeout_s: float = 600) -> None:
    pytest.importorskip("triton")
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def run_script_interpreted(script: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``python scripts/<script> ARGS`` under the interpreter; asserts it exited 0 and returns it."""
    pytest.importorskip("triton")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out
