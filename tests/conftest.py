"""Tests run on the CPU, offline: no hub access, results written to a scratch directory."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def scratch_results(tmp_path, monkeypatch):
    """Never write test results into the committed data/results."""
    monkeypatch.setenv("SERVELAB_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"
