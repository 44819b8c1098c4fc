"""Study 3's measuring path through the engine's speculative mode, on a CPU in float32 with tiny random models.

- The generation sweep (``sweep.generation_sweep``): greedy speculative output equals plain decoding's, at fixed and
  adaptive γ; its rows carry the counts and phases the speedup table reduces.
- An adaptive γ in the engine (``set_gamma("adaptive:…")``) grows by one a step while every draft is kept.
- Prompt lookup's timing (``lookup_speed.lookup_sweep``): same tokens as plain decoding, rows that
  ``tables.lookup_table`` reduces.
- Verify and rollback costs (``cost_ratio.verify_cost``, ``rollback_cost``) time the engine's steps.
- The costs part's step timing alternates the two models, step by step (``cost_ratio.paired_step_costs``), and
  ``tables.cost_ratios`` takes c as the median over the pairs.
"""

import numpy as np
import pandas as pd
import pytest
import torch

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.models.native import native_from_hf
from servelab.studies.s03_speculative import cost_ratio, tables
from servelab.studies.s03_speculative.lookup_speed import batch_prompts, lookup_sweep
from servelab.studies.s03_speculative.sweep import generation_sweep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    """The tiny Llama as target, itself (every draft kept) and a second random Llama (most drafts rejected) as drafts,
    as the engine's model code."""
    hf = {
        "target": load_model("config:tiny-llama", seed=0).model,
        "other": load_model("config:tiny-llama", seed=3).model,
    }
    native = {name: native_from_hf(m, max_positions=256) for name, m in hf.items()}
    native["twin"] = native["target"]
    return native


def repeating_prompts(seed: int, shapes) -> list[list[int]]:
    """Prompts of ``n`` tokens that repeat a motif of ``period`` (prompt lookup finds drafts in them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, period in shapes:
        motif = torch.randint(3, 512, (period,), generator=g).tolist()
        out.append((motif * (n // period + 1))[:n])
    return out


def test_the_sweep_is_plain_decoding_token_for_token_at_fixed_and_adaptive_gamma(models):
    prompts = repeating_prompts(1, ((9, 3), (14, 5)))
    raw = generation_sweep(
        models,
        [("twin", "target"), ("other", "target")],
        prompts,
        [2, "adaptive:1:1:4"],
        [0.0],
        12,
        max_model_len=64,
        warmup=0,
        repeats=1,
        chain_steps=4,
        progress=False,
    )
    assert (raw.status == "ok").all(), raw.status.unique()
    assert set(raw.method) == {"autoregressive", "autoregressive_chained", "speculative"}
    plain = raw[raw.method == "autoregressive"].set_index("prompt").output
    for _, r in raw[raw.method != "autoregressive"].iterrows():
        assert r.output == plain[r.prompt] and r.tokens == 12
    spec = raw[raw.method == "speculative"]
    twin, other = spec[spec.draft == "twin"], spec[spec.draft == "other"]
    assert (twin.accepted == twin.proposed).all() and (twin.rejections == 0).all() and (twin.proposed > 0).all()
    assert (other.rejections > 0).all() and (other.accepted < other.proposed).all()
    assert (spec.rounds > 0).all() and (spec.verify_ms > 0).all() and (spec.rollback_ms >= 0).all()
    assert (spec.catch_up_rounds == spec.rounds - spec.rejections).all()  # batch 1: one request a step
    # 11 tokens after the prefill's: the adaptive twin drafts 1, 2, 3 (kept, 9 tokens), then the one the last two
    # tokens leave room for; a fixed γ = 2 never proposes more than 2 a step
    adaptive = twin[twin.gamma == "adaptive:1:1:4"]
    assert adaptive.proposed.tolist() == [1 + 2 + 3 + 1] * 2 and adaptive.rounds.tolist() == [4, 4]
    # every timed round counts (the draft followed the prompt in the prefill step, so the first round catches up one
    # token as the others do): each runs as many steps as its largest k, 1 + 2 + 3 + 1
    assert adaptive.draft_steps.tolist() == [1 + 2 + 3 + 1] * 2
    assert (spec[spec.gamma == "2"].proposed <= 2 * spec[spec.gamma == "2"].rounds).all()
    speed = tables.speedup_table(raw, {})
    assert len(speed) == 4 and (speed.greedy_exact_match == 1).all()


def test_an_adaptive_gamma_grows_while_every_draft_is_kept(models):
    from servelab.engine import EngineConfig
    from servelab.engine.speculative_engine import SpeculativeEngine
    from servelab.speculative.config import SpeculativeConfig

    cfg = EngineConfig(block_size=4, num_blocks=64, max_model_len=96)
    e = SpeculativeEngine(
        models["target"], cfg, speculative=SpeculativeConfig("draft_model", 4, "(given)"), draft=models["twin"]
    )
    e.set_gamma("adaptive:1:1:4")
    e.add_request([5, 9, 11, 7], SamplingParams(max_tokens=30, ignore_eos=True))
    e.step()  # the prefill
    drafted = []
    while e.has_unfinished():
        before = e.spec_stats.num_draft_tokens
        e.step()
        drafted.append(e.spec_stats.num_draft_tokens - before)
    assert drafted[:5] == [1, 2, 3, 4, 4]
    with pytest.raises(ParameterError, match="width"):
        e.set_gamma("adaptive:2:1:8")


def test_lookup_timing_gives_plain_decodings_tokens_and_the_table_reduces_it(models):
    prompts = repeating_prompts(2, ((5, 5), (18, 6), (30, 4)))
    raw = lookup_sweep(models["target"], prompts, batches=(1, 4), gammas=(2, 3), max_new_tokens=10, repeats=2)
    assert len(raw) == 2 * 2 * (1 + 2)  # batches × repeats × (plain + each γ)
    assert (raw.tokens == 10 * raw.batch).all()
    table = tables.lookup_table(raw)
    assert [(r.batch, r.gamma) for r in table.itertuples()] == [(1, 2), (1, 3), (4, 2), (4, 3)]
    assert (table.same_tokens == 1).all() and (table.repeats == 2).all() and (table.host_syncs_per_round >= 1).all()
    lk = raw[raw.method == "lookup"]
    assert (lk.proposed <= lk.asked).all() and (lk.asked > 0).all() and (lk.propose_ms > 0).all()
    assert lk.accepted.sum() > 0 and (table.tokens_per_round >= 1).all()
    assert batch_prompts(prompts, 4) == prompts + prompts[:1]
    with pytest.raises(ParameterError):
        lookup_sweep(models["target"], prompts, repeats=0)


def test_verify_and_rollback_costs_time_the_engines_steps(models):
    rows = [1, 3, 5]
    engine = cost_ratio.verify_engine(models["target"], cost_ratio.verify_config(16, rows, warmup=1, repeats=3), rows)
    verify = cost_ratio.verify_cost(engine, "target", 16, rows, warmup=1, repeats=3)
    assert (verify.status == "ok").all(), verify.status.unique()
    assert verify.rows.tolist() == rows and (verify.median_ms > 0).all()
    # each γ's steps verified γ drafts (the override's random ones)
    assert engine.spec_stats.num_draft_tokens == 4 * (2 + 4)  # warm-up and repeats, at γ = 2 and 4
    back = cost_ratio.rollback_cost(engine, "target", 16, [1, 4, 8], repeats=5)
    assert back.dropped.tolist() == [1, 4, 8] and (back.median_us > 0).all() and (back.repeats == 5).all()
    assert engine.leaked() == [] and not engine.has_unfinished()


def test_the_costs_part_alternates_the_two_models_steps(monkeypatch):
    """The two models' steps run draft, target, draft, target …, warm-up included, and c is the median over pairs."""
    calls = []

    def recording_mode(model, batch, new, context):
        def step():
            calls.append(model.name_for_test)
            for _ in range(model.work):
                torch.mm(torch.ones(32, 32), torch.ones(32, 32))

        return step, None

    monkeypatch.setitem(cost_ratio.MODES, "recording", recording_mode)
    draft = load_model("config:tiny-llama", seed=0).model
    target = load_model("config:tiny-qwen2", seed=0).model
    draft.name_for_test, draft.work = "d", 1
    target.name_for_test, target.work = "t", 40
    out = cost_ratio.paired_step_costs(("d", draft), ("t", target), ["recording"], context=8, warmup=2, repeats=7)
    assert calls == ["d", "t"] * 9
    assert (out.status == "ok").all() and out.model.tolist() == ["d", "t"] and out.paired_with.tolist() == ["t", "d"]
    assert (out.repeats == 7).all() and out.c_paired.nunique() == 1 and 0 < out.c_paired.iloc[0] < 1
    ratios = tables.cost_ratios(out, [("d", "t")])
    assert ratios.c.iloc[0] == out.c_paired.iloc[0]  # the median over pairs, not the ratio of the two medians
    # older runs timed each model alone: their c is still the ratio of the medians
    alone = out.drop(columns=["paired_with", "c_paired"])
    assert tables.cost_ratios(alone, [("d", "t")]).c.iloc[0] == pytest.approx(
        out.median_ms.iloc[0] / out.median_ms.iloc[1]
    )
    # a page reads both together: the real part's steps, timed alone, beside the costs part's paired shape steps
    real = alone.assign(model=["rd", "rt"])
    both = tables.cost_ratios(pd.concat([out, real], ignore_index=True), [("d", "t"), ("rd", "rt")])
    assert both.draft.tolist() == ["d", "rd"] and both.c.iloc[0] == out.c_paired.iloc[0]
    assert both.c.iloc[1] == pytest.approx(out.median_ms.iloc[0] / out.median_ms.iloc[1])


def test_a_mode_that_fails_is_a_row_per_model():
    def broken(model, batch, new, context):
        raise RuntimeError("no such mode here")

    m = load_model("config:tiny-llama", seed=0).model
    modes = dict(cost_ratio.MODES, broken=broken)
    orig = cost_ratio.MODES
    cost_ratio.MODES = modes
    try:
        out = cost_ratio.paired_step_costs(("d", m), ("t", m), ["broken"], context=8, warmup=0, repeats=1)
    finally:
        cost_ratio.MODES = orig
    assert out.model.tolist() == ["d", "t"] and out.status.str.startswith("error: RuntimeError").all()
    assert isinstance(out, pd.DataFrame) and np.isnan(out.get("c_paired", pd.Series([np.nan]))).all()


def test_the_engine_modes_step_is_compiled_as_the_sweeps_engines_are(monkeypatch):
    """F3.2 predicts the sweep's speed-ups from c, and the sweep's engines compile their blocks (EngineConfig's
    "auto"); bench.step's engine step does not unless asked. Study 3 asks it (``cost_engine_compile``), the HF modes
    take no such argument, and each row says how its step ran (``compile``)."""
    seen = {}

    def engine(model, batch, new, context, compile=False):
        seen["engine"] = compile

        def step():
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))

        step.engine = type("E", (), {"stats": lambda self: {"compile": f"stub {compile}"}})()
        return step, None

    def hf(model, batch, new, context):
        return (lambda: torch.mm(torch.ones(8, 8), torch.ones(8, 8))), None

    monkeypatch.setitem(cost_ratio.MODES, "engine", engine)
    monkeypatch.setitem(cost_ratio.MODES, "hf_eager", hf)
    m = load_model("config:tiny-llama", seed=0).model
    kw = dict(context=8, warmup=0, repeats=2, engine_compile="auto")
    out = cost_ratio.paired_step_costs(("d", m), ("t", m), ["hf_eager", "engine"], **kw)
    assert seen["engine"] == "auto" and (out.status == "ok").all()
    assert out.set_index("mode").loc["engine", "compile"].tolist() == ["stub auto", "stub auto"]
    assert out.set_index("mode").loc["hf_eager", "compile"].tolist() == ["", ""]
    alone = cost_ratio.step_costs({"m": m}, ["engine"], context=8, warmup=0, repeats=1, progress=False)
    assert seen["engine"] is False and alone["compile"].tolist() == ["stub False"]  # the default stays off


def test_study3_asks_the_engine_step_compiled_and_refuses_other_values():
    from servelab.studies.s03_speculative.params import study_params

    assert study_params("smoke")["cost_engine_compile"] == "auto"
    with pytest.raises(ParameterError, match="cost_engine_compile"):
        study_params("smoke", cost_engine_compile="yes")
