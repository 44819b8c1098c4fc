"""Study 3's parameters: profile defaults, overrides from papermill, and validation."""

from __future__ import annotations

from servelab.bench.hf_modes import MODES
from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.spec.gamma import gamma_policy
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve_profile,
)

DTYPES = ("float32", "bfloat16", "float16")

DEFAULTS = {
    # H200 budget: ≈150 s after the family's training. The generation sweep stops itself at time_budget_s.
    "full": dict(
        target=None,
        drafts=None,
        dtype="bfloat16",
        gammas=[1, 2, 4, 8, "adaptive"],
        temperatures=[0.0, 1.0],
        num_prompts=5,
        prompt_len=128,
        max_new_tokens=96,
        warmup=1,
        repeats=2,
        time_budget_s=60,
        shape_pairs=[["config:qwen2-0.5b", "config:qwen2-1.5b"]],
        cost_modes=["hf_eager", "hf_cuda_graph", "engine"],
        cost_context=128,
        cost_repeats=15,
        verify_rows=[1, 2, 3, 4, 5, 6, 7, 8, 9],
        middle_target=True,
        chain_steps=8,
        seed=0,
    ),
    # two CPU cores: the tiny trained family, a few points
    "smoke": dict(
        target=None,
        drafts=None,
        dtype="float32",
        gammas=[2, "adaptive"],
        temperatures=[0.0, 1.0],
        num_prompts=2,
        prompt_len=24,
        max_new_tokens=12,
        warmup=0,
        repeats=1,
        time_budget_s=None,
        shape_pairs=[["config:tiny-llama", "config:tiny-qwen2"]],
        cost_modes=["hf_eager", "engine"],
        cost_context=16,
        cost_repeats=3,
        verify_rows=[1, 2, 4],
        middle_target=True,
        chain_steps=4,
        seed=0,
    ),
}


def _check_spec(name: str, spec) -> None:
    if not isinstance(spec, str) or not spec:
        raise ParameterError(f"{name} must be a model spec string, got {spec!r}")
    if spec.startswith(CONFIG_PREFIX) and spec[len(CONFIG_PREFIX) :] not in shipped_configs():
        raise ParameterError(f"{name}: unknown config {spec!r}; shipped: {', '.join(shipped_configs())}")


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply non-None overrides, validate (``ParameterError`` on bad input)."""
    prof = resolve_profile(profile)
    p = {k: (list(v) if isinstance(v, list) else v) for k, v in DEFAULTS[prof].items()}
    unknown = set(overrides) - set(p)
    if unknown:
        raise ParameterError(f"unknown parameters {sorted(unknown)}; known: {sorted(p)}")
    p.update({k: v for k, v in overrides.items() if v is not None})
    p["profile"] = prof

    if (p["target"] is None) != (p["drafts"] is None):
        raise ParameterError("give both target and drafts (model specs), or neither (the trained family)")
    if p["target"] is not None:
        _check_spec("target", p["target"])
        if isinstance(p["drafts"], str):
            p["drafts"] = [p["drafts"]]
        if not isinstance(p["drafts"], list) or not p["drafts"]:
            raise ParameterError(f"drafts must be a non-empty list of model specs, got {p['drafts']!r}")
        for d in p["drafts"]:
            _check_spec("drafts", d)
    check_choice("dtype", p["dtype"], DTYPES)
    gammas = p["gammas"]
    if not isinstance(gammas, list) or not gammas:
        raise ParameterError(f"gammas must be a non-empty list of positive ints or 'adaptive', got {gammas!r}")
    for g in gammas:
        gamma_policy(g)  # ParameterError on anything else
    temps = p["temperatures"]
    if not isinstance(temps, list) or not temps:
        raise ParameterError(f"temperatures must be a non-empty list, got {temps!r}")
    for t in temps:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 10:
            raise ParameterError(f"temperatures must be numbers in [0, 10] (0 = greedy), got {t!r}")
    p["temperatures"] = sorted({float(t) for t in temps})
    check_int_range("num_prompts", p["num_prompts"], 1, 1000)
    check_int_range("prompt_len", p["prompt_len"], 1, 8192)
    check_int_range("max_new_tokens", p["max_new_tokens"], 1, 8192)
    check_int_range("warmup", p["warmup"], 0, 100)
    check_int_range("repeats", p["repeats"], 1, 1000)
    tb = p["time_budget_s"]
    if tb is not None and (isinstance(tb, bool) or not isinstance(tb, (int, float)) or tb <= 0):
        raise ParameterError(f"time_budget_s must be a positive number of seconds or None, got {tb!r}")
    pairs = p["shape_pairs"]
    if not isinstance(pairs, list):
        raise ParameterError(f"shape_pairs must be a list of [draft spec, target spec], got {pairs!r}")
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ParameterError(f"each shape_pairs entry must be [draft spec, target spec], got {pair!r}")
        for s in pair:
            _check_spec("shape_pairs", s)
    p["shape_pairs"] = [list(x) for x in pairs]
    if isinstance(p["cost_modes"], str):
        p["cost_modes"] = [p["cost_modes"]]
    if not p["cost_modes"]:
        raise ParameterError("cost_modes must not be empty")
    for m in p["cost_modes"]:
        check_choice("cost_modes", m, MODES)
    import torch

    if "hf_cuda_graph" in p["cost_modes"] and not torch.cuda.is_available():
        raise ParameterError("cost mode 'hf_cuda_graph' needs a CUDA device; drop it from cost_modes on the CPU")
    check_int_range("cost_context", p["cost_context"], 1, 1 << 16)
    check_int_range("cost_repeats", p["cost_repeats"], 1, 1000)
    p["verify_rows"] = check_positive_ints("verify_rows", p["verify_rows"], maximum=64)
    if not isinstance(p["middle_target"], bool):
        raise ParameterError(f"middle_target must be True or False, got {p['middle_target']!r}")
    check_int_range("chain_steps", p["chain_steps"], 0, 64)  # 0: no multi-step baseline
    check_int_range("seed", p["seed"], 0, 2**31 - 1)
    return p


def max_gamma(gammas) -> int:
    return max(gamma_policy(g).max_gamma for g in gammas)
