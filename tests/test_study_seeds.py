"""Every study takes a ``seed`` parameter (the campaign gives repeat r the seed default + r), and Study 5's seed reaches
its random inputs and its document mask: two seeds draw different inputs, one seed the same."""

from __future__ import annotations

import importlib

import pandas as pd
import pytest
import torch

from servelab.errors import ParameterError
from servelab.studies.s05_attention import measure as study5_measure
from servelab.studies.s05_attention import sweep as study5_sweep
from servelab.studies.s05_attention.params import study_params as study5_params
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape

STUDIES = [
    "s01_scheduling",
    "s02_gpu_costs",
    "s03_speculative",
    "s04_kv_cache",
    "s05_attention",
    "s06_hf_assisted",
    "s07_prefix_cache",
    "s08_simulator",
]


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_takes_a_seed_defaulting_to_0_in_every_profile(study):
    params = importlib.import_module(f"servelab.studies.{study}.params")
    assert all(d.get("seed", None) == 0 for d in params.DEFAULTS.values()), study
    assert params.study_params("smoke", seed=7)["seed"] == 7
    with pytest.raises(ParameterError, match="seed"):
        params.study_params("smoke", seed="seven")


def test_study5s_seed_is_validated():
    assert study5_params("smoke")["seed"] == 0 and study5_params("full", seed=3)["seed"] == 3
    for bad in (-1, 1.5, True, 2**31):
        with pytest.raises(ParameterError, match="seed"):
            study5_params("smoke", seed=bad)


def test_one_seed_draws_the_same_inputs_and_two_seeds_different_ones():
    shape = AttentionShape.prefill(Architecture.from_model("tiny-llama"), 16)
    a, again, b = (shape.random_inputs(torch.float32, "cpu", s) for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a, again, strict=True))
    assert not any(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    doc = {s: study5_sweep.mask_factories(8, 16, s)["document"](256).doc_lengths for s in (0, 0, 1)}
    assert sum(doc[0]) == sum(doc[1]) == 256 and doc[0] != doc[1]
    assert study5_sweep.mask_factories(8, 16, 0)["document"](256).doc_lengths == doc[0]


def test_the_pages_sweeps_draw_every_shapes_inputs_from_the_runs_seed(monkeypatch):
    """``measure._sweeps`` with P["seed"] = 5: every measured shape (prefill, decode, masks) is measured with seed 5,
    and the document mask's lengths are seed 5's (the timing itself is replaced: only the wiring is under test)."""
    seen, docs = [], []

    def fake_measure(shape, variants, *, seed, **kw):
        seen.append(seed)
        if shape.mask.kind == "document":
            docs.append(shape.mask.doc_lengths)
        return [{"variant": v, "status": "skipped"} for v in variants]

    monkeypatch.setattr(study5_sweep, "measure_shape", fake_measure)
    P = study5_params("smoke", seed=5)
    prefill, decode, masks = study5_measure._sweeps(P, torch.float32, "cpu")
    assert len(seen) > 3 and set(seen) == {5}
    assert all(isinstance(df, pd.DataFrame) and len(df) for df in (prefill, decode, masks))
    want = study5_sweep.mask_factories(P["window"], P["document_tokens"], 5)["document"]
    assert docs == [want(L).doc_lengths for L in sorted(P["mask_lengths"])]
    assert docs != [
        study5_sweep.mask_factories(P["window"], P["document_tokens"], 0)["document"](L).doc_lengths
        for L in sorted(P["mask_lengths"])
    ]


def test_make_reproduce_runs_every_notebook_once_each_after_what_it_reads():
    """``make reproduce``'s order (the campaign's ``ORDER``, which a GPU run takes its jobs in): every study notebook
    once; 08 after 01 (it replays 01's runs), 02 after 08 (it compares with the simulator), 03 after 06 (its curves
    draw 06's measured α)."""
    from servelab.paths import REPO_ROOT
    from servelab.studies.common.campaign import ORDER

    assert "campaign plan" in (REPO_ROOT / "Makefile").read_text()  # make reproduce runs the campaign's plan
    assert sorted(ORDER) == sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(set(ORDER)) == len(ORDER)
    at = {s: i for i, s in enumerate(ORDER)}
    assert at["01_scheduling"] < at["08_simulator"] < at["02_gpu_costs"]
    assert at["06_hf_assisted"] < at["03_speculative"]
