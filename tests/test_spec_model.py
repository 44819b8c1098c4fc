"""The analytical model, γ policies, Study 3's parameters, tables and verdicts (no models run)."""

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.speculative import leviathan
from servelab.speculative.gamma import AdaptiveGamma, FixedGamma, gamma_policy
from servelab.studies.s03_speculative import verdicts
from servelab.studies.s03_speculative.params import DEFAULTS, study_params
from servelab.studies.s03_speculative.tables import pays_map, speedup_table


def test_expected_tokens_matches_a_simulation_of_the_rounds():
    rng = np.random.default_rng(0)
    for alpha, gamma in [(0.0, 3), (0.6, 4), (0.9, 2)]:
        kept = (rng.random((200_000, gamma)) < alpha).cumprod(axis=1).sum(axis=1)
        assert leviathan.expected_tokens(alpha, gamma) == pytest.approx((kept + 1).mean(), rel=0.01)
    assert leviathan.expected_tokens(1.0, 5) == 6


def test_improvement_and_break_even():
    assert leviathan.improvement(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert leviathan.improvement(0.0, 3, 0.1) == pytest.approx(1 / 1.3)  # nothing kept: the drafts are pure cost
    a = leviathan.break_even_alpha(0.2, 3)
    assert leviathan.improvement(a, 3, 0.2) == pytest.approx(1.0)
    assert leviathan.break_even_alpha(1.0, 4) == 1.0  # a draft as slow as the target never pays
    g, imp = leviathan.best_gamma(0.9, 0.05)
    assert imp == max(leviathan.improvement(0.9, k, 0.05) for k in range(1, 17)) and g > 3
    arr = leviathan.improvement(np.array([0.5, 0.9]), np.array([2, 2]), 0.1)
    assert arr.shape == (2,) and arr[1] > arr[0]
    with pytest.raises(ValueError):
        leviathan.expected_tokens(1.5, 2)
    with pytest.raises(ValueError):
        leviathan.improvement(0.5, 0, 0.1)


def test_alpha_mle_recovers_alpha_from_censored_rounds():
    rng = np.random.default_rng(1)
    alpha, gamma = 0.7, 4
    draws = rng.random((50_000, gamma)) < alpha
    kept = draws.cumprod(axis=1).sum(axis=1)
    assert leviathan.alpha_mle(int(kept.sum()), int((kept < gamma).sum())) == pytest.approx(alpha, abs=0.01)
    assert np.isnan(leviathan.alpha_mle(0, 0))


def test_gamma_policies():
    a = AdaptiveGamma(initial=3, min_gamma=1, max_gamma=4)
    for accepted, want in [(3, 4), (4, 4), (1, 3), (0, 2), (1, 2), (0, 1), (0, 1)]:
        a.update(accepted, a.gamma)
        assert a.gamma == want
    assert a.fresh().gamma == 3
    f = FixedGamma(5)
    f.update(0, 5)
    assert f.gamma == 5
    assert isinstance(gamma_policy("adaptive"), AdaptiveGamma)
    assert gamma_policy("adaptive:2:1:6").max_gamma == 6
    for bad in (0, -1, True, "adaptive:x", "adaptive:1:2", 2.5):
        with pytest.raises(ParameterError):
            gamma_policy(bad)
    with pytest.raises(ParameterError, match="min_gamma <= initial"):
        AdaptiveGamma(initial=9, max_gamma=8)


def test_study_params_defaults_and_errors():
    p = study_params("smoke")
    assert p["profile"] == "smoke" and p["target"] is None
    assert study_params("smoke", temperatures=[1, 0])["temperatures"] == [0.0, 1.0]
    assert p["draft_layers"] == [1] and DEFAULTS["full"]["draft_layers"] is None  # None: the recipe's layers
    assert study_params("smoke", draft_layers=[6, 2])["draft_layers"] == [2, 6]
    for kw, match in [
        (dict(draft_layers=[0]), "draft_layers"),
        (dict(draft_layers=[30]), "draft_layers"),
        (dict(gammas=[0]), "gamma"),
        (dict(chain_steps=-1), "chain_steps"),
        (dict(gammas=[]), "gammas"),
        (dict(temperatures=[-1]), "temperatures"),
        (dict(target="config:tiny-llama"), "both target and drafts"),
        (dict(target="config:nope", drafts=["config:tiny-llama"]), "unknown config"),
        (dict(shape_pairs=[["config:tiny-llama"]]), "shape_pairs"),
        (dict(cost_modes=["warp"]), "cost_modes"),
        (dict(num_prompts=0), "num_prompts"),
        (dict(time_budget_s=-1), "time_budget_s"),
        (dict(bogus=1), "unknown parameters"),
    ]:
        with pytest.raises(ParameterError, match=match):
            study_params("smoke", **kw)
    with pytest.raises(ParameterError, match="profile"):
        study_params("huge")


def _run(method, prompt, ms, draft="", gamma="", output="1 2 3", **counts):
    """One run of 10 tokens on target ``t`` at temperature 0 that took ``ms``; ``counts``: its round counters."""
    return dict(
        method=method,
        target="t",
        draft=draft,
        gamma=gamma,
        temperature=0.0,
        prompt=prompt,
        status="ok",
        tokens=10,
        ms=ms,
        ms_per_token=ms / 10,
        **counts,
        output=output,
    )


def _sweep():
    """Two prompts; the speculative run takes half the baseline's time on one and 2/3 on the other."""
    none = dict(rounds=0, accepted=0, proposed=0, rejections=0, draft_ms=0, verify_ms=0, rollback_ms=0)
    rows = [_run("autoregressive", p, ms, **none) for p, ms in [(0, 100.0), (1, 90.0)]]
    rows += [_run("autoregressive_chained", p, ms) for p, ms in [(0, 75.0), (1, 60.0)]]
    rows += [
        _run(
            "speculative",
            p,
            ms,
            draft="d",
            gamma="2",
            output="1 2 3" if p == 0 else "1 2 4",
            rounds=5,
            accepted=acc,
            proposed=10,
            rejections=rej,
            draft_ms=ms / 3,
            verify_ms=ms / 2,
            rollback_ms=0.01,
        )
        for p, ms, acc, rej in [(0, 50.0, 6, 2), (1, 60.0, 4, 3)]
    ]
    return pd.DataFrame(rows)


def test_speedup_table_and_verdicts_from_data():
    speed = speedup_table(_sweep(), {("d", "t"): 0.1})
    r = speed.iloc[0]
    assert r.speedup == pytest.approx(np.median([100 / 50, 90 / 60]))
    assert r.alpha == pytest.approx(10 / 15) and r.acceptance_rate == pytest.approx(0.5)
    assert r.predicted_speedup == pytest.approx(leviathan.improvement(10 / 15, 2, 0.1))
    assert r.greedy_exact_match == 0.5
    assert r.speedup_vs_chained == pytest.approx(np.median([75 / 50, 60 / 60]))
    f31 = verdicts.f31(speed, 0.01, "test pair", tested_on="pair d → t")
    assert f31.verdict == "changes" and f31.id == "F3.1" and f31.tested_on == "pair d → t"  # the CI lies above 1
    assert f31.headline == pytest.approx(r.speedup) and "best configuration" in f31.headline_unit
    f32 = verdicts.f32(speed)
    err = abs(r.prediction_error_pct)
    assert f32.verdict == ("holds" if err <= 20 else "changes" if err <= 50 else "fails")
    assert f32.headline == pytest.approx(err) and "median |prediction error|" in f32.headline_unit
    slow = speedup_table(
        _sweep().assign(ms=lambda d: np.where(d.method == "speculative", d.ms * 3, d.ms)), {("d", "t"): 0.1}
    )
    assert verdicts.f31(slow, 0.01, "test pair").verdict == "holds"


def test_f33_compares_modes_with_the_parameter_ratio():
    def ratios(eager, graph):
        return pd.DataFrame(
            [
                dict(draft="qwen2-0.5b", target="qwen2-1.5b", mode=m, c=1 / r, target_over_draft=r, param_ratio=3.1)
                for m, r in (("hf_eager", eager), ("engine", graph))
            ]
        )

    holds = verdicts.f33(ratios(1.2, 2.6), ("qwen2-0.5b", "qwen2-1.5b"))
    assert holds.verdict == "holds" and holds.headline == pytest.approx(1.2 / 3.1)  # eager far below: < 0.5
    assert verdicts.f33(ratios(2.9, 3.0), ("qwen2-0.5b", "qwen2-1.5b")).verdict == "changes"
    # the bar is relative to eager HF's ratio: "no mode reaches 1.25× further" beside 1.40× read as absolute
    short = verdicts.f33(ratios(1.2, 1.4), ("qwen2-0.5b", "qwen2-1.5b"))
    assert short.verdict == "changes" and "no mode reaches 1.25 × the eager ratio (1.50×)" in short.note
    assert verdicts.f33(ratios(1.2, 2.6).iloc[:0], ("qwen2-0.5b", "qwen2-1.5b")).verdict == "fails"


def test_f33_second_condition_shows_both_ratios_of_each_repeat():
    # F3.3's repeats split on the quotient best/eager (1.17×, 2.17×, 1.06× on the H200), and only the two ratios
    # behind it show that eager HF's moved (1.22, 0.67, 1.37) while the engine's held (1.43-1.45)
    def ratios(eager, engine):
        return pd.DataFrame(
            [
                dict(draft="d", target="t", mode=m, target_over_draft=r, param_ratio=3.1)
                for m, r in (("hf_eager", eager), ("engine", engine))
            ]
        )

    reps = [("repeat 1 of 3", ratios(1.22, 1.43)), ("repeat 2 of 3", ratios(0.67, 1.45))]
    text = verdicts.second_condition(reps, ("d", "t"), ["changes", "holds"])
    assert "1.17× in repeat 1 of 3 (engine 1.43× over eager 1.22×)" in text
    assert "2.16× in repeat 2 of 3 (engine 1.45× over eager 0.67×)" in text
    assert text.endswith("so the second is what split them")
    assert verdicts.second_condition([("repeat 1 of 3", ratios(1.2, 1.4).iloc[1:])], ("d", "t"), ["changes"]) == ""


def test_pays_map_break_even_line():
    grid = pays_map(np.array([0.0, 0.5, 0.95]), np.array([0.05, 1.0]))
    assert (grid[grid.c == 1.0].improvement < 1).all()  # a draft as costly as the target never pays
    assert grid[(grid.alpha == 0.95) & (grid.c == 0.05)].improvement.iloc[0] > 3


def test_model_set_from_specs_and_its_errors(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from servelab.studies.s03_speculative.pair import load_model_set, native_models

    ms = load_model_set("config:tiny-llama", ["config:tiny-llama"], profile="smoke", dtype="float32", device="cpu")
    assert ms.target == "tiny-llama" and ms.drafts == ["tiny-llama#0"] and ms.family is None
    prompts = ms.prompts(3, 7, seed=1)
    assert len(prompts) == 3 and all(len(p) == 7 for p in prompts)
    native = native_models(ms, 64)
    assert list(native) == ["tiny-llama", "tiny-llama#0"] and all(m.shape.vocab == 512 for m in native.values())
    assert ms.pairs() == [("tiny-llama#0", "tiny-llama")]
    three = load_model_set(
        "config:tiny-llama", ["config:tiny-gpt2", "config:tiny-llama"], profile="smoke", dtype="float32", device="cpu"
    )
    big, small = sorted(three.drafts, key=lambda d: -sum(p.numel() for p in three.hf[d].parameters()))
    assert three.pairs() == [(d, "tiny-llama") for d in three.drafts] + [(small, big)]  # the middle target
    assert three.pairs(middle_target=False) == [(d, "tiny-llama") for d in three.drafts]
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(tmp_path / "other")
    with pytest.raises(ParameterError, match="vocabularies differ"):
        load_model_set("config:tiny-llama", [str(tmp_path / "other")], profile="smoke", dtype="float32", device="cpu")
    with pytest.raises(ParameterError, match="both target and drafts"):
        load_model_set("config:tiny-llama", None, profile="smoke", dtype="float32", device="cpu")


def test_step_costs_and_cost_ratios_record_failures_as_rows():
    import torch

    from servelab.measure import Roofline
    from servelab.models import load_model
    from servelab.studies.s03_speculative.cost_ratio import step_costs
    from servelab.studies.s03_speculative.tables import cost_ratios

    models = {"small": load_model("config:tiny-gpt2").model, "big": load_model("config:tiny-llama").model}
    roof = Roofline(matmul_tflop_s=0.1, copy_gb_s=10.0)
    steps = step_costs(
        models, ["hf_eager", "hf_cuda_graph"], context=8, roofline=roof, warmup=1, repeats=2, progress=False
    )
    assert len(steps) == 4
    ok = steps[steps.status == "ok"]
    assert set(ok["mode"]) == {"hf_eager"} and (ok.median_ms > 0).all()
    if not torch.cuda.is_available():
        assert steps[steps["mode"] == "hf_cuda_graph"].status.str.startswith("error").all()
    r = cost_ratios(steps, [("small", "big")])
    row = r.iloc[0]
    assert row.c == pytest.approx(ok.set_index("model").median_ms["small"] / ok.set_index("model").median_ms["big"])
    assert row.target_over_draft == pytest.approx(1 / row.c) and row.param_ratio > 0
    floors = steps.drop_duplicates("model").set_index("model").floor_ms
    assert row.floor_ratio == pytest.approx(floors["big"] / floors["small"])
    assert (ok.pct_of_floor > 0).all()
    assert cost_ratios(steps.iloc[:0], [("small", "big")]).empty


def _errors(errors) -> pd.DataFrame:
    e = np.asarray(errors, float)
    return pd.DataFrame(dict(prediction_error_pct=e, speedup=1.0, predicted_speedup=1.0 + e / 100))


def test_f32_says_when_its_median_error_is_within_noise_of_a_threshold():
    # the committed H200 case: median |error| 20.15% over 50 points against the 20% line
    near = verdicts.f32(_errors(np.linspace(5.15, 35.15, 51)[:-1] + 0.3))
    assert near.verdict == "changes" and near.measured_value.startswith("median |error| 20.1% over 50 points")
    assert near.measured_value.endswith("; within one repeat's noise of the 20% threshold")  # the page's table says it
    assert "Near a threshold within this repeat: its median |error| 20.15% is within one noise width of the 20%" in (
        near.note
    )
    assert "order-statistic interval of that median over the repeat's 50 points" in near.note
    far = verdicts.f32(_errors(np.linspace(34.0, 36.0, 50)))  # 35% ± 1: far from 20% and 50%
    assert far.verdict == "changes" and "Near a threshold" not in far.note and "noise" not in far.measured_value
    few = verdicts.f32(_errors([19.0, 21.0, 30.0]))  # three points: the interval is the min–max
    assert few.verdict == "changes" and "min–max of that median over the repeat's 3 points, 19.0–30.0%" in few.note
    assert verdicts.near_prediction_thresholds(pd.Series([np.inf, np.nan])) == ""


def test_near_threshold_reading_says_which_interval_decides():
    from dataclasses import replace

    near = verdicts.f32(_errors(np.linspace(5.15, 35.15, 51)[:-1] + 0.3))
    combined = replace(near, repeats=3, repeat_verdicts="changes;changes;changes", spread="20.5–24.35")
    reading = verdicts.near_threshold_reading(combined)
    assert "each repeat's median |error| against 20% and 50%" in reading
    assert "(changes, changes, changes; their medians 20.5–24.35%)" in reading
    assert "only annotates that call: every repeat fell on the changes side" in reading
    assert verdicts.with_near_reading([combined])[0].note.endswith(reading)
    split = replace(combined, verdict="inconclusive", repeat_verdicts="changes;holds;changes")
    assert "fell on the" not in verdicts.near_threshold_reading(split)  # the repeats disagree: no common side
    far = replace(verdicts.f32(_errors(np.linspace(34.0, 36.0, 50))), repeats=3, repeat_verdicts="changes;changes")
    assert verdicts.near_threshold_reading(far) == "" and verdicts.with_near_reading([far]) == [far]


def test_f31_weighs_the_choice_of_the_best_and_the_stronger_baseline():
    speed = pd.DataFrame(
        {"draft": ["d", "d"], "target": ["t", "t"], "gamma": [2, 4], "temperature": [0.0, 0.0], "alpha": [0.4, 0.4],
         "speedup": [1.2, 1.05], "speedup_ci_low": [1.1, 0.9], "speedup_ci_high": [1.3, 1.2],
         "speedup_vs_chained": [0.95, 0.9], "speedup_vs_chained_ci_low": [0.9, 0.8]}
    )  # fmt: skip
    f = verdicts.f31(speed, 0.3, "t")
    assert f.verdict == "changes"
    assert "the highest of the 2 measured, picked after the fact with no correction" in f.note
    assert "its 95% CI starts at 1.10" in f.note
    assert "the stronger baseline, none of the 2 pays with its whole CI above 1, and the best reads 0.95×" in f.note


def test_loop_ratio_sentence_compares_with_the_rules_bar():
    above = verdicts.loop_ratio_sentence(1.22, 1.68, ("qwen2-0.5b", "qwen2-1.5b"))
    assert (
        "1.680× (1/c, with c = 0.595 in Study 3's table of where each pair pays: the median over every γ and α at "
        "batch 1), is above 1.25 × the median eager ratio (1.52×)" in above
    )
    assert "is below" in verdicts.loop_ratio_sentence(1.4, 1.68, ("a", "b"))
    assert verdicts.loop_ratio_sentence(float("nan"), 1.68, ("a", "b")) == ""
