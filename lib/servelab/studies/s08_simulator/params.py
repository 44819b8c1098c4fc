"""Notebook 08's parameters: profile defaults, overrides from papermill, validation.

``full`` replays Study 1's H200 runs (written by notebook 01 just before), sizes the capacity search to about a
minute of CPU time and simulates the whole hour of the speed goal; ``smoke`` makes its own "real" runs by
driving the engine in-process with ``config:tiny-llama`` on the CPU (``engine_replay``), in well under a minute.

The ``affinity_*`` parameters size the comparison of routers over replicas with prefix caches
(``servelab.studies.s08_simulator.prefix_routing``): in ``full``, Study 7's server workload (system prompts of
2,048 tokens, a 64-token suffix, 32 tokens out) with 64 prompts over 4 replicas, with a KV pool that holds twice
the prompts and one that holds a third of them, at 1–4× the rate one replica serves.
"""

from __future__ import annotations

from servelab.sim.routers import ROUTERS
from servelab.studies.common.params import ParameterError, check_choice, resolve

DEFAULTS = {
    "full": dict(
        capacity_model="config:qwen2-0.5b",
        cost_modes=["engine", "hf_cuda_graph"],
        calibration_every=2,
        capacity_routers=list(ROUTERS),
        capacity_rate_multiples=[1, 2, 4, 8],
        capacity_duration_s=15.0,
        capacity_max_requests=3000,
        capacity_time_budget_s=75.0,
        slo_ttft_ms=None,
        slo_tpot_ms=None,
        max_replicas=32,
        prefix_groups=16,
        prefix_tokens=256,
        speed_rate=100.0,
        speed_replicas=8,
        speed_duration_s=3600.0,
        seed=0,
        affinity_prefixes=64,
        affinity_prefix_tokens=2048,
        affinity_suffix_tokens=64,
        affinity_output_tokens=32,
        affinity_replicas=4,
        affinity_pool_fractions=[2.0, 0.33],
        affinity_rate_multiples=[1, 2, 3, 4],
        affinity_requests=3000,
        smoke_rates=None,
        smoke_requests=None,
    ),
    "smoke": dict(
        capacity_model="config:tiny-llama",
        cost_modes=["engine", "hf_cuda_graph"],
        calibration_every=2,
        capacity_routers=list(ROUTERS),
        capacity_rate_multiples=[1, 3],
        capacity_duration_s=3.0,
        capacity_max_requests=600,
        capacity_time_budget_s=30.0,
        slo_ttft_ms=None,
        slo_tpot_ms=None,
        max_replicas=8,
        prefix_groups=4,
        prefix_tokens=16,
        speed_rate=100.0,
        speed_replicas=8,
        speed_duration_s=10.0,
        seed=0,
        affinity_prefixes=8,
        affinity_prefix_tokens=64,
        affinity_suffix_tokens=16,
        affinity_output_tokens=8,
        affinity_replicas=2,
        affinity_pool_fractions=[2.0, 0.33],
        affinity_rate_multiples=[1, 2],
        affinity_requests=300,
        smoke_rates=[15.0, 45.0],
        smoke_requests=16,
    ),
}


def _positive(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ParameterError(f"{name} must be a positive number, got {v!r}")
    return float(v)


def _positive_int(name, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ParameterError(f"{name} must be a positive integer, got {v!r}")
    return v


def _positive_list(name, v) -> list[float]:
    if not isinstance(v, (list, tuple)) or not v:
        raise ParameterError(f"{name} must be a non-empty list of positive numbers, got {v!r}")
    return sorted(_positive(name, x) for x in v)


_POSITIVE_INTS = (
    "calibration_every",
    "capacity_max_requests",
    "max_replicas",
    "prefix_groups",
    "prefix_tokens",
    "speed_replicas",
    "affinity_prefixes",
    "affinity_prefix_tokens",
    "affinity_suffix_tokens",
    "affinity_output_tokens",
    "affinity_replicas",
    "affinity_requests",
)


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply the non-None overrides, validate (``ParameterError`` names the culprit)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_cost_model(p)
    _check_capacity(p)
    _check_sizes(p)
    _check_smoke_runs(p)
    return p


def _check_cost_model(p: dict) -> None:
    if not isinstance(p["capacity_model"], str) or not p["capacity_model"]:
        raise ParameterError(f"capacity_model must be a model spec string, got {p['capacity_model']!r}")
    modes = p["cost_modes"]
    if not isinstance(modes, (list, tuple)) or not modes or not all(isinstance(m, str) and m for m in modes):
        raise ParameterError(f"cost_modes must be a non-empty list of Study 2 mode names, got {modes!r}")


def _check_capacity(p: dict) -> None:
    """Routers, rates, durations, budgets and SLOs of the capacity and speed parts."""
    if not isinstance(p["capacity_routers"], (list, tuple)) or not p["capacity_routers"]:
        raise ParameterError(f"capacity_routers must be a non-empty list from {ROUTERS}")
    for r in p["capacity_routers"]:
        check_choice("capacity_routers", r, ROUTERS)
    for k in ("capacity_rate_multiples", "affinity_pool_fractions", "affinity_rate_multiples"):
        p[k] = _positive_list(k, p[k])
    for k in ("capacity_duration_s", "capacity_time_budget_s", "speed_rate", "speed_duration_s"):
        p[k] = _positive(k, p[k])
    if p["speed_duration_s"] > 3600:
        raise ParameterError(f"speed_duration_s must be at most 3600 (one hour), got {p['speed_duration_s']}")
    for k in ("slo_ttft_ms", "slo_tpot_ms"):
        if p[k] is not None:
            p[k] = _positive(k, p[k])


def _check_sizes(p: dict) -> None:
    for k in _POSITIVE_INTS:
        _positive_int(k, p[k])
    if p["calibration_every"] < 2:
        raise ParameterError("calibration_every must be >= 2, or no run would be left to validate on")
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise ParameterError(f"seed must be an integer, got {p['seed']!r}")


def _check_smoke_runs(p: dict) -> None:
    """The CPU stand-in runs' rates and sizes: the smoke profile's defaults wherever they are used."""
    if p["profile"] == "smoke" or p["smoke_rates"] is not None:
        rates = p["smoke_rates"] or DEFAULTS["smoke"]["smoke_rates"]
        p["smoke_rates"] = sorted(_positive("smoke_rates", r) for r in rates)
        p["smoke_requests"] = _positive_int(
            "smoke_requests", p["smoke_requests"] or DEFAULTS["smoke"]["smoke_requests"]
        )
