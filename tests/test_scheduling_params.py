"""Study 1's parameters: profile defaults validate, bad overrides fail with a message naming them."""

import pytest

from servelab.errors import ParameterError
from servelab.studies.s01_scheduling.params import study_params
from servelab.studies.s01_scheduling.sweep import estimate_runtime_s, plan_points


def test_profiles_validate_and_full_fits_its_budget():
    full = study_params("full")
    assert full["models"] == ["config:qwen2-0.5b", "config:llama-3-8b"]
    assert ["eager_cont_batch", full["max_num_batched_tokens"]] in full["policies"]  # None → whole prompts
    assert full["min_requests"] == 150 and full["budget_sweep"] == [128, 256, 1024, 4096]
    # one GPU command runs at most 600 s: each run's sweep (of one part) stops at time_budget_s, skipping the rest
    assert full["engine_process"] is True and full["time_budget_s"] <= 400
    smoke = study_params("smoke")
    assert smoke["models"] == ["config:tiny-llama"] and smoke["dtype"] == "float32" and smoke["engine_process"]
    assert study_params("smoke", engine_process=False)["engine_process"] is False
    # the CPU smoke run stays short even if every point runs to its cap (CI: under 3 minutes for the notebook)
    assert estimate_runtime_s(smoke) < 90


def test_plan_pairs_policies_on_shared_traces():
    P = study_params("full")
    pts = plan_points(P, "config:llama-3-8b")
    by_fraction = {}
    for p in pts:
        by_fraction.setdefault(p.rate_fraction, set()).add(p.seed)
    assert all(len(seeds) == 1 for seeds in by_fraction.values())  # one trace per rate
    budgets = [p.budget for p in pts if p.sweep == "budget"]
    assert budgets == [128, 256, 1024, 4096]
    assert not [p for p in plan_points(P, "config:qwen2-0.5b") if p.sweep == "budget"]


@pytest.mark.parametrize(
    "override, match",
    [
        (dict(models=[]), "models"),
        (dict(models=["config:nope"]), "unknown config"),
        (dict(policies=[["lifo", None]]), "policy"),
        (dict(policies=[["eager_cont_batch", 1024], ["chunked_prefill", 512]]), "whole prompts"),
        (dict(policies=[["eager_cont_batch", None], ["chunked_prefill", 999999]]), "<="),
        (dict(policies=[["chunked_prefill", 512]]), "eager_cont_batch"),
        (dict(reference_budget=1024), "reference_budget"),
        (dict(budget_sweep_fraction=0.5), "budget_sweep_fraction"),
        (dict(budget_sweep=[16]), "max_num_seqs"),
        (dict(rate_fractions=[0.5, -1]), "rate_fractions"),
        (dict(min_requests=0), "min_requests"),
        (dict(point_cap_s=-1), "point_cap_s"),
        (dict(parts=["gpt-5"]), "names no model"),
        (dict(parts=["qwen2-0.5b/budget"]), "not a setting"),
        (dict(parts=["llama-3-8b/chunked_prefill@64"]), "not a setting"),
        (dict(parts=[]), "parts"),
        (dict(capacities={"config:qwen2-0.5b": 0}), "capacities"),
        (dict(capacities=3.0), "capacities"),
        (dict(prompt_max=8000, output_max=512), "max_model_len"),
        (dict(slo_itl_ms="fast"), "slo_itl_ms"),
        (dict(engine_process="yes"), "engine_process"),
        (dict(engine_process=1), "engine_process"),
        (dict(profile_typo=1), "unknown parameters"),
    ],
)
def test_bad_parameters(override, match):
    with pytest.raises(ParameterError, match=match):
        study_params("full", **override)


def test_bad_profile():
    with pytest.raises(ParameterError, match="profile"):
        study_params("medium")
