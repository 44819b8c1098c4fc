"""Study 3's controlled-acceptance sweep through the engine's speculative mode (``s03_speculative/controlled_engine``),
on a CPU in float32 with the smoke profile's tiny pair: every row holds the columns the committed runs' rows hold, so
``tables.controlled_table`` reduces it; the controlled draws decide what is kept, and the target agrees with each of
them (float32); acceptance comes out near the α set; the sweep over γ runs on one engine; a point past the time
budget is a row that says so."""

import pytest
import torch

from servelab.studies.s03_speculative import controlled_engine, tables
from servelab.studies.s03_speculative.params import study_params

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sweep():
    P = study_params(
        "smoke",
        alphas=[0.5, 0.9],
        controlled_gammas=[1, 3],
        batches=[2],
        controlled_repeats=2,
        controlled_new_tokens=24,
    )
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return P, controlled_engine.controlled_sweep(P, "cpu", progress=False)
    finally:
        torch.set_num_threads(n)


def test_every_row_has_the_committed_runs_columns_and_the_table_reduces_it(sweep):
    P, raw = sweep
    assert (raw.status == "ok").all(), raw.status.unique()
    spec = raw[raw.method == "speculative"]
    assert len(raw[raw.method == "plain"]) == 2 and len(spec) == 2 * 2 * 2  # repeats; γ × α × repeats
    theirs = {"tokens", "seconds", "tokens_per_s", "rounds", "accepted", "proposed", "rejections", "draft_steps"}
    assert theirs | {"draft_ms", "verify_ms", "agreed", "seq_rounds", "host_syncs_per_round"} <= set(spec.columns)
    assert (spec.tokens == 2 * P["controlled_new_tokens"]).all() and (spec.draft_ms > 0).all()
    # every draft round is one of c's (the draft followed the prompts in the prefill step): none is held apart, and
    # the device phases lie within the wall time
    assert (spec.draft_first_ms == 0).all() and (spec.draft_steps >= spec.rounds).all()
    assert (spec.draft_ms + spec.verify_ms < 1e3 * spec.seconds).all()
    t = tables.controlled_table(raw)
    assert len(t) == 4 and (t.agreement == 1.0).all()  # float32: the target keeps what the draws keep
    assert ((t.loop_overhead_pct > 0) & (t.loop_overhead_pct < 100)).all()
    assert (t.c > 0).all() and (t.verify_over_step > 0).all() and (t.tokens_per_s_plain > 0).all()


def test_acceptance_follows_the_alpha_set_and_gamma_bounds_the_drafts(sweep):
    _, raw = sweep
    spec = raw[raw.method == "speculative"]
    for (g, a), rows in spec.groupby(["gamma", "alpha"]):
        assert (rows.proposed <= g * rows.seq_rounds).all() and (rows.proposed > 0).all()
        kept = rows.accepted.sum() / rows.proposed.sum()
        assert abs(kept - a) < 0.35 if g == 1 else kept > 0  # γ = 1: each draft is kept with probability α
        assert (rows.rejections <= rows.seq_rounds).all()
    hi, lo = (spec[spec.alpha == x].accepted.sum() / spec[spec.alpha == x].proposed.sum() for x in (0.9, 0.5))
    assert hi > lo


def test_a_point_past_the_budget_is_a_row_that_says_so():
    P = study_params("smoke", alphas=[0.5], controlled_gammas=[1], batches=[1], controlled_repeats=1)
    plain, spec = controlled_engine.load_engines(*P["controlled_pairs"][0], P, "cpu")
    budget = controlled_engine._Budget(0.0)
    rows = controlled_engine.measure_batch(plain, spec, 1, P, budget, ("d", "t"))
    assert [r["status"] for r in rows if r["method"] == "speculative"] == ["skipped: time budget"]
    assert [r["status"] for r in rows if r["method"] == "plain"] == ["ok"]


@pytest.mark.gpu
def test_on_the_gpu_the_sweep_runs_through_the_graphs_and_its_timers_read_the_device():
    """On CUDA the engines capture graphs, the draft and verify timers are CUDA events (``measure.call_timer``) and
    the sync audit counts real host syncs, none of which a CPU run reaches.
    The smoke pair in the profile's dtype, one γ and α, two batch sizes."""
    P = study_params(
        "smoke", alphas=[0.8], controlled_gammas=[2], batches=[1, 2], controlled_repeats=2, controlled_new_tokens=24
    )
    raw = controlled_engine.controlled_sweep(P, "cuda", progress=False)
    assert (raw.status == "ok").all(), raw.status.unique()
    spec = raw[raw.method == "speculative"]
    assert len(spec) == 2 * 2 and (spec.draft_ms > 0).all() and (spec.verify_ms > 0).all()
    assert (spec.host_syncs_per_round >= 1).all()  # the engine reads each step's tokens: at least that one
    t = tables.controlled_table(raw)
    assert len(t) == 2 and (t.c > 0).all() and (t.tokens_per_s_plain > 0).all()
