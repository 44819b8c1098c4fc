"""Fitting what a prefill chunk pays to read its cached context from Study 2's chunk-after-context steps."""

import pandas as pd
import pytest

from servelab.profiles import ParameterError
from servelab.sim import StepCostModel
from servelab.sim.context_reads import context_rows, fit_chunk_context, with_context_reads
from servelab.sim.cost_model import CostModel

GPU = CostModel("m", "engine", {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
                {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4}, {})
BASE = StepCostModel(gpu=GPU)
K = 1.2e-3   # the truth: ms per cached token a chunk reads


def _steps(k=K, mixed_fixed=1.5):
    """Study 2's steps.csv rows that matter: fresh and chunk-after-context prefills, fresh and contextual mixed
    steps (whose own fixed cost the fit must not take for context reads), and rows of another mode."""
    rows = []
    for n in (128, 512):
        for c in (0, 512, 2048):
            t = BASE.gpu_ms(n, n * (c + n / 2), 0, 0, n * c) + k * c
            rows.append(dict(model="m", mode="engine", phase="prefill", batch=1, new_tokens=n, context=c, decodes=0,
                             decode_context=0, median_ms=t, status="ok"))
    for c in (0, 1024):
        t = BASE.gpu_ms(512, 512 * (c + 256), 16, 16 * 512, 512 * c) + mixed_fixed + k * c
        rows.append(dict(model="m", mode="engine", phase="mixed", batch=1, new_tokens=512, context=c, decodes=16,
                         decode_context=512, median_ms=t, status="ok"))
    rows.append(dict(model="m", mode="hf_eager", phase="prefill", batch=1, new_tokens=128, context=512, decodes=0,
                     decode_context=0, median_ms=999.0, status="ok"))
    return pd.DataFrame(rows)


def test_context_rows_keeps_only_chunks_after_context():
    rows = context_rows(_steps(), "m", "engine")
    assert len(rows) == 5 and (rows["context"] > 0).all() and set(rows["phase"]) == {"prefill", "mixed"}


def test_fit_recovers_the_cost_of_reading_context():
    model, st = with_context_reads(BASE, _steps(), "m", "engine")
    assert model.ms_per_chunk_context_token == pytest.approx(K, rel=1e-3)
    assert st["rows"] == 5 and st["median_abs_pct_after"] < 0.1 < st["median_abs_pct_before"]
    # the mixed step's own fixed cost cancels against the fresh mixed step: it is not read as context
    assert with_context_reads(BASE, _steps(mixed_fixed=10.0), "m", "engine")[0].ms_per_chunk_context_token == \
        pytest.approx(K, rel=1e-3)


def test_no_context_rows_leaves_the_model_alone():
    fresh = _steps()
    fresh = fresh[fresh["context"] == 0]
    assert with_context_reads(BASE, fresh, "m", "engine") == (BASE, None)
    assert with_context_reads(BASE, None, "m", "engine") == (BASE, None)
    with pytest.raises(ParameterError, match="no chunk-after-context"):
        fit_chunk_context(BASE, fresh)
    with pytest.raises(ParameterError, match="lack columns"):
        context_rows(pd.DataFrame({"model": ["m"]}), "m", "engine")
