"""Tests run on the CPU, offline: no hub access, results written to a scratch directory."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# every test computes its reports afresh: a test that patches a report must see its patch, never a kept record
# (tests/test_report_cache.py turns the cache on where it is the subject)
os.environ["SERVELAB_REPORT_CACHE"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def scratch_results(tmp_path, monkeypatch):
    """Never write test results into the committed data/results."""
    monkeypatch.setenv("SERVELAB_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models on a shared 2-core box: one intra-op thread avoids OpenMP contention (4-10× faster there).
    A module opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
