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


def pytest_collection_modifyitems(config, items):
    """A test marked ``gpu`` needs a CUDA device: without one it is skipped. The marker (pyproject.toml) is what
    names the GPU tests as a set: ``-m gpu`` selects all of them (``make gpu-test``), ``-m gpu_quick`` the quick tier
    (``make gpu-test-quick``); tests/test_gpu_tiers.py checks the tiers."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in gpu:
        item.add_marker(skip)
