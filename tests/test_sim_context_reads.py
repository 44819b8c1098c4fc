"""Fitting what a step pays to read cached context: a prefill chunk's (Study 2's chunk-after-context steps), a
decode's (its decode steps), and where a server's mixed steps show it."""

import numpy as np
import pandas as pd
import pytest
from sim_traces import logged_run, poisson_trace, run_features

from servelab.errors import ParameterError
from servelab.sim import StepCostModel
from servelab.sim.cost_model import CostModel
from servelab.studies.s08_simulator.context_reads import (
    context_rows,
    decode_walk_check,
    fit_chunk_context,
    fit_decode_walk,
    mixed_step_excess,
    with_context_reads,
)

GPU = CostModel(
    "m",
    "engine",
    {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
    {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4},
    {},
)
BASE = StepCostModel(gpu=GPU)
K = 1.2e-3  # the truth: ms per cached token a chunk reads


COLUMNS = ["mode", "phase", "batch", "new_tokens", "context", "decodes", "decode_context", "median_ms"]


def _frame(rows):
    """Study 2's steps.csv rows of model ``m`` that ran, from tuples in ``COLUMNS``' order."""
    return pd.DataFrame(rows, columns=COLUMNS).assign(model="m", status="ok")


def _steps(k=K, mixed_fixed=1.5):
    """Study 2's steps.csv rows that matter: fresh and chunk-after-context prefills, fresh and contextual mixed
    steps (whose own fixed cost the fit must not take for context reads), and rows of another mode."""
    rows = [
        ("engine", "prefill", 1, n, c, 0, 0, BASE.gpu_ms(n, n * (c + n / 2), 0, 0, n * c) + k * c)
        for n in (128, 512)
        for c in (0, 512, 2048)
    ]
    for c in (0, 1024):
        t = BASE.gpu_ms(512, 512 * (c + 256), 16, 16 * 512, 512 * c) + mixed_fixed + k * c
        rows.append(("engine", "mixed", 1, 512, c, 16, 512, t))
    rows.append(("hf_eager", "prefill", 1, 128, 512, 0, 0, 999.0))
    return _frame(rows)


def test_context_rows_keeps_only_chunks_after_context():
    rows = context_rows(_steps(), "m", "engine")
    assert len(rows) == 5 and (rows["context"] > 0).all() and set(rows["phase"]) == {"prefill", "mixed"}


def test_fit_recovers_the_cost_of_reading_context():
    model, st = with_context_reads(BASE, _steps(), "m", "engine")
    assert model.ms_per_longest_context_token == pytest.approx(K, rel=1e-3)
    assert st["rows"] == 5 and st["median_abs_pct_after"] < 0.1 < st["median_abs_pct_before"]
    # the mixed step's own fixed cost cancels against the fresh mixed step: it is not read as context
    assert with_context_reads(BASE, _steps(mixed_fixed=10.0), "m", "engine")[
        0
    ].ms_per_longest_context_token == pytest.approx(K, rel=1e-3)


def test_no_context_rows_leaves_the_model_alone():
    fresh = _steps()
    fresh = fresh[fresh["context"] == 0]
    assert with_context_reads(BASE, fresh, "m", "engine") == (BASE, None)
    assert with_context_reads(BASE, None, "m", "engine") == (BASE, None)
    with pytest.raises(ParameterError, match="no chunk-after-context"):
        fit_chunk_context(BASE, fresh)
    with pytest.raises(ParameterError, match="lack columns"):
        context_rows(pd.DataFrame({"model": ["m"]}), "m", "engine")


W = 3e-4  # the truth: ms per token of a decode-only step's longest sequence


def _decode_rows(w=W):
    """Study 2's decode steps as the decode kernel times them: the longest sequence sets part of the step."""
    truth = {"intercept_ms": 2.0, "ms_per_seq": 0.004, "ms_per_ctx_token": 1e-6}
    a, per_seq, per_ctx = (truth[k] for k in ("intercept_ms", "ms_per_seq", "ms_per_ctx_token"))
    rows = [
        ("engine", "decode", b, 1, c, 0, 0, a + per_seq * b + per_ctx * b * c + w * c)
        for b in (1, 4, 16, 64, 256)
        for c in (128, 512, 2048, 8192)
    ]
    return _frame(rows), truth


def test_decode_terms_refitted_with_the_longest_sequence():
    rows, truth = _decode_rows()
    model, st = fit_decode_walk(BASE, rows, "m", "engine")
    assert model.ms_per_decode_walk_token == pytest.approx(W, rel=1e-3)
    assert model.gpu.decode == pytest.approx(truth, rel=1e-3)
    assert st["median_abs_pct_after"] < 0.1 < st["median_abs_pct_before"]
    # one sequence of 8,192 tokens, priced as measured
    assert model.step_ms(0, 0, 1, 8192, 1, 0.0, 8192) == pytest.approx(
        rows[(rows["batch"] == 1) & (rows["context"] == 8192)]["median_ms"].iloc[0]
    )
    check = decode_walk_check(BASE, rows, "m", "engine")
    assert len(check) == len(rows) and (abs(check["after_ms"] / check["measured_ms"] - 1) < 1e-3).all()
    # the prefill side is untouched, and a step model's decode terms are not refitted
    assert model.gpu.prefill == BASE.gpu.prefill
    assert fit_decode_walk(BASE, rows[rows["batch"] == 1].head(3), "m", "engine") == (BASE, None)
    assert decode_walk_check(BASE, rows.head(3), "m", "engine").empty


def test_with_context_reads_prices_both_walks():
    rows, _ = _decode_rows()
    model, st = with_context_reads(BASE, pd.concat([_steps(), rows], ignore_index=True), "m", "engine")
    assert model.ms_per_decode_walk_token == pytest.approx(W, rel=1e-3)
    assert model.ms_per_longest_context_token == pytest.approx(K, rel=1e-3)  # the chunks' fit is unaffected


def test_mixed_step_excess_is_what_the_model_charges_for_walks():
    # a chunked server whose mixed steps pay for the longest context in them: measured against the model that
    # made them, each mixed step's excess is exactly the model's price of the walk and the mixed-step cost
    truth = StepCostModel(
        gpu=GPU, step_overhead_ms=0.5, mixed_step_ms=0.7, ms_per_longest_context_token=K, ms_per_decode_walk_token=W
    )
    trace = poisson_trace(np.random.default_rng(3), 10, (300, 1500), (20, 120), n=80)
    feats = run_features(logged_run(trace, truth, 256))
    ex = mixed_step_excess(truth, feats)
    assert len(ex) > 20
    assert np.allclose(ex["excess_ms"], ex["priced_ms"], rtol=0.02, atol=0.05)
    assert mixed_step_excess(truth, feats[feats["decode_tokens"] == 0]).empty
