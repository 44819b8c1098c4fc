"""The analytical model, γ policies, Study 3's parameters, tables and verdicts (no models run)."""

import numpy as np
import pandas as pd
import pytest

from servelab.profiles import ParameterError
from servelab.speculative import leviathan, verdicts
from servelab.speculative.gamma import AdaptiveGamma, FixedGamma, gamma_policy
from servelab.speculative.params import study_params
from servelab.speculative.study import pays_map, speedup_table


def test_expected_tokens_matches_a_simulation_of_the_rounds():
    rng = np.random.default_rng(0)
    for alpha, gamma in [(0.0, 3), (0.6, 4), (0.9, 2)]:
        kept = (rng.random((200_000, gamma)) < alpha).cumprod(axis=1).sum(axis=1)
        assert leviathan.expected_tokens(alpha, gamma) == pytest.approx((kept + 1).mean(), rel=0.01)
    assert leviathan.expected_tokens(1.0, 5) == 6


def test_improvement_and_break_even():
    assert leviathan.improvement(0.8, 4, 0.0) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert leviathan.improvement(0.0, 3, 0.1) == pytest.approx(1 / 1.3)    # nothing kept: the drafts are pure cost
    a = leviathan.break_even_alpha(0.2, 3)
    assert leviathan.improvement(a, 3, 0.2) == pytest.approx(1.0)
    assert leviathan.break_even_alpha(1.0, 4) == 1.0                       # a draft as slow as the target never pays
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
    for kw, match in [(dict(gammas=[0]), "gamma"), (dict(gammas=[]), "gammas"), (dict(temperatures=[-1]), "temperatures"),
                      (dict(target="config:tiny-llama"), "both target and drafts"),
                      (dict(target="config:nope", drafts=["config:tiny-llama"]), "unknown config"),
                      (dict(shape_pairs=[["config:tiny-llama"]]), "shape_pairs"), (dict(cost_modes=["warp"]), "cost_modes"),
                      (dict(num_prompts=0), "num_prompts"), (dict(time_budget_s=-1), "time_budget_s"),
                      (dict(bogus=1), "unknown parameters")]:
        with pytest.raises(ParameterError, match=match):
            study_params("smoke", **kw)
    with pytest.raises(ParameterError, match="profile"):
        study_params("huge")


def _sweep():
    """Two prompts; the speculative run takes half the baseline's time on one and 2/3 on the other."""
    rows = []
    for p, ms in [(0, 100.0), (1, 90.0)]:
        rows.append(dict(method="autoregressive", draft="", gamma="", temperature=0.0, prompt=p, status="ok", tokens=10,
                         ms=ms, ms_per_token=ms / 10, rounds=0, accepted=0, proposed=0, rejections=0, draft_ms=0,
                         verify_ms=0, rollback_ms=0, output="1 2 3"))
    for p, ms, acc, rej in [(0, 50.0, 6, 2), (1, 60.0, 4, 3)]:
        rows.append(dict(method="speculative", draft="d", gamma="2", temperature=0.0, prompt=p, status="ok", tokens=10,
                         ms=ms, ms_per_token=ms / 10, rounds=5, accepted=acc, proposed=10, rejections=rej,
                         draft_ms=ms / 3, verify_ms=ms / 2, rollback_ms=0.01, output="1 2 3" if p == 0 else "1 2 4"))
    return pd.DataFrame(rows)


def test_speedup_table_and_verdicts_from_data():
    speed = speedup_table(_sweep(), {"d": 0.1})
    r = speed.iloc[0]
    assert r.speedup == pytest.approx(np.median([100 / 50, 90 / 60]))
    assert r.alpha == pytest.approx(10 / 15) and r.acceptance_rate == pytest.approx(0.5)
    assert r.predicted_speedup == pytest.approx(leviathan.improvement(10 / 15, 2, 0.1))
    assert r.greedy_exact_match == 0.5
    f31 = verdicts.f31(speed, 0.01, "test pair")
    assert f31["verdict"] == "changes" and f31["id"] == "F3.1"       # the CI lies above 1
    f32 = verdicts.f32(speed)
    err = abs(r.prediction_error_pct)
    assert f32["verdict"] == ("holds" if err <= 20 else "changes" if err <= 50 else "fails")
    slow = speedup_table(_sweep().assign(ms=lambda d: np.where(d.method == "speculative", d.ms * 3, d.ms)), {"d": 0.1})
    assert verdicts.f31(slow, 0.01, "test pair")["verdict"] == "holds"


def test_f33_compares_modes_with_the_parameter_ratio():
    def ratios(eager, graph):
        return pd.DataFrame([dict(draft="qwen2-0.5b", target="qwen2-1.5b", mode=m, c=1 / r, target_over_draft=r,
                                  param_ratio=3.1) for m, r in (("hf_eager", eager), ("engine", graph))])
    assert verdicts.f33(ratios(1.2, 2.6), ("qwen2-0.5b", "qwen2-1.5b"))["verdict"] == "holds"
    assert verdicts.f33(ratios(2.9, 3.0), ("qwen2-0.5b", "qwen2-1.5b"))["verdict"] == "changes"
    assert verdicts.f33(ratios(1.2, 2.6).iloc[:0], ("qwen2-0.5b", "qwen2-1.5b"))["verdict"] == "fails"


def test_pays_map_break_even_line():
    grid = pays_map(np.array([0.0, 0.5, 0.95]), np.array([0.05, 1.0]))
    assert (grid[grid.c == 1.0].improvement < 1).all()            # a draft as costly as the target never pays
    assert grid[(grid.alpha == 0.95) & (grid.c == 0.05)].improvement.iloc[0] > 3
