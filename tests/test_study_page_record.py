"""What every study's page record holds (studies.common.study_page): its runs, its findings, and the device the
runs measured on; each study's record adds its own tables after them."""

import importlib
from types import SimpleNamespace

import pytest

from servelab.studies.common.study_page import StudyPage

PAGES = [
    ("s02_gpu_costs", "Study2Page"),
    ("s03_speculative", "Study3Page"),
    ("s04_kv_cache", "Study4Page"),
    ("s05_attention", "Study5Page"),
]


@pytest.mark.parametrize(("study", "name"), PAGES)
def test_a_study_record_is_a_study_page_with_runs_and_findings_first(study, name):
    cls = getattr(importlib.import_module(f"servelab.studies.{study}.report"), name)
    runs = SimpleNamespace(device_name="NVIDIA H200")
    page = cls(runs, ["finding"])
    assert isinstance(page, StudyPage)
    assert (page.runs, page.findings, page.device) == (runs, ["finding"], "NVIDIA H200")
