"""Study 1's parameters: profile defaults, overrides from papermill, validation.

The ``full`` profile: two model sizes, four policy settings at three rates each, and the whole budget sweep of
ChunkedPrefill on the 8B shape at one rate. Each (policy, rate) point offers load until ``min_requests`` (150)
requests can complete, within ``point_cap_s`` (``sizing``: a point that falls short says so in its ``shortfall``).
That is more GPU time than one GPU run holds, so the sweep runs in parts (``part``: one of ``measure.PARTS``, each a
run of its own within ``time_budget_s``; ``parts``: selectors for part "all"); the report reads every part's folder.
Rates are fractions of a capacity estimate that a short probe measures on each model (``capacity_probe``), so that
the sweep spans light load to past saturation whatever the engine's speed; ``capacities`` fixes them instead (an
earlier part's results folder, or req/s per model), so that every part offers the same rates and traces.
``engine_process`` (both profiles: True) runs each model's engine in a process of its own, away from the
HTTP server's GIL (``serving.PolicyServer``); False serves it from an engine thread of the notebook's process.
"""

from __future__ import annotations

from servelab.engine.policies import POLICIES
from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.studies.common.params import ParameterError, check_choice, check_positive_ints, resolve

DTYPES = ("float32", "bfloat16", "float16")
# The full profile's rates and ITL SLO are fixed per model, so that every part and every repeat offers the same rates
# (the policies of one rate replay one trace, whichever part measures them) and judges capacity at one SLO. Both come
# from the H200's legacy run (runs/legacy/all/r0/probes.csv): its probe's capacity estimate (req/s) and 5x its
# decode iteration (ms, Sarathi-Serve's strict SLO). Each part still runs the probe and records it.
LEGACY_CAPACITY_REQ_S = {"config:qwen2-0.5b": 51.91, "config:llama-3-8b": 10.39}
LEGACY_SLO_ITL_MS = {"config:qwen2-0.5b": 20.19, "config:llama-3-8b": 48.89}

DEFAULTS = {
    "full": dict(
        models=["config:qwen2-0.5b", "config:llama-3-8b"],
        dtype="bfloat16",
        # [policy, budget]; budget None: whole prompts (FCFS, EagerContBatch) get max_num_batched_tokens
        policies=[["fcfs", None], ["eager_cont_batch", None], ["chunked_prefill", 512], ["chunked_prefill", 2048]],
        budget_sweep=[128, 256, 1024, 4096],
        budget_sweep_model="config:llama-3-8b",
        budget_sweep_fraction=0.7,
        rate_fractions=[0.3, 0.7, 1.2],
        fallback_rates=[0.5, 1.0, 2.0],
        min_requests=150,
        point_cap_s=180.0,
        drain_s=5.0,
        probe_requests=12,
        probe_s=8.0,
        max_num_seqs=64,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        num_blocks=None,
        prompt_scale=1.0,
        output_scale=0.25,
        prompt_max=6000,
        output_max=512,
        reference_budget=512,
        slo_itl_factor=5.0,
        slo_itl_ms=dict(LEGACY_SLO_ITL_MS),
        slo_ttft_ms=None,
        search_factor=2.0,
        search_steps=3,
        search_min_requests=40,
        time_budget_s=390.0,
        seed=0,
        engine_process=True,
        parts=None,
        capacities=dict(LEGACY_CAPACITY_REQ_S),
    ),
    "smoke": dict(
        models=["config:tiny-llama"],
        dtype="float32",
        policies=[["fcfs", None], ["eager_cont_batch", None], ["chunked_prefill", 32]],
        budget_sweep=[128],
        budget_sweep_model="config:tiny-llama",
        budget_sweep_fraction=0.5,
        rate_fractions=[0.5, 1.5],
        fallback_rates=[2.0, 8.0],
        min_requests=6,
        point_cap_s=3.0,
        drain_s=1.5,
        probe_requests=6,
        probe_s=4.0,
        max_num_seqs=8,
        max_model_len=512,
        max_num_batched_tokens=512,
        num_blocks=512,
        prompt_scale=0.05,
        output_scale=0.05,
        prompt_max=300,
        output_max=40,
        reference_budget=32,
        slo_itl_factor=5.0,
        slo_itl_ms=None,
        slo_ttft_ms=None,
        search_factor=2.0,
        search_steps=1,
        search_min_requests=4,
        time_budget_s=120.0,
        seed=0,
        engine_process=True,
        parts=None,
        capacities=None,
    ),
}


def _positive(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ParameterError(f"{name} must be a positive number, got {v!r}")
    return float(v)


def _check_spec(name: str, spec) -> None:
    if not isinstance(spec, str) or not spec:
        raise ParameterError(f"{name} must be a model spec string, got {spec!r}")
    if spec.startswith(CONFIG_PREFIX) and spec[len(CONFIG_PREFIX) :] not in shipped_configs():
        raise ParameterError(f"{name}: unknown config {spec!r}; shipped: {', '.join(shipped_configs())}")


INT_SIZES = (
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "probe_requests",
    "prompt_max",
    "output_max",
    "reference_budget",
    "min_requests",
    "search_min_requests",
)
POSITIVE = (
    "point_cap_s",
    "drain_s",
    "probe_s",
    "prompt_scale",
    "output_scale",
    "slo_itl_factor",
    "time_budget_s",
    "budget_sweep_fraction",
    "search_factor",
)


def _check_models_and_sizes(p: dict) -> None:
    if not isinstance(p["models"], (list, tuple)) or not p["models"]:
        raise ParameterError(f"models must be a non-empty list of model specs, got {p['models']!r}")
    for m in p["models"]:
        _check_spec("models", m)
    check_choice("dtype", p["dtype"], DTYPES)
    for k in INT_SIZES:
        check_positive_ints(k, [p[k]])
    if p["num_blocks"] is not None:
        check_positive_ints("num_blocks", [p["num_blocks"]])
    if p["prompt_max"] + p["output_max"] > p["max_model_len"]:
        raise ParameterError(
            f"prompt_max + output_max ({p['prompt_max']} + {p['output_max']}) must fit "
            f"max_model_len ({p['max_model_len']})"
        )
    whole = p["prompt_max"] + p["output_max"]  # what a whole-prompt policy recomputes in one step after preemption
    if whole > p["max_num_batched_tokens"]:
        raise ParameterError(
            f"prompt_max + output_max ({whole}) must be <= max_num_batched_tokens ({p['max_num_batched_tokens']}): "
            f"FCFS and EagerContBatch prefill a whole prompt (and, after a preemption, its outputs) in one step"
        )


def _policy(item, p: dict) -> list:
    """One ``[policy, budget]`` entry, its budget resolved (None: the engine's largest step) and checked."""
    top, whole = p["max_num_batched_tokens"], p["prompt_max"] + p["output_max"]
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        raise ParameterError(f"each policies entry must be [policy, budget or None], got {item!r}")
    name, budget = item
    check_choice("policy", name, tuple(POLICIES))
    budget = top if budget is None else budget
    check_positive_ints(f"{name} budget", [budget], maximum=top)
    if budget < p["max_num_seqs"]:
        raise ParameterError(f"{name} budget {budget} must be >= max_num_seqs ({p['max_num_seqs']})")
    if name != "chunked_prefill" and budget < whole:
        raise ParameterError(
            f"{name} prefills whole prompts: its budget ({budget}) must be >= prompt_max + output_max ({whole})"
        )
    return [name, int(budget)]


def _check_policies(p: dict) -> None:
    pols = p["policies"]
    if not isinstance(pols, (list, tuple)) or not pols:
        raise ParameterError(f"policies must be a non-empty list of [policy, budget], got {pols!r}")
    p["policies"] = norm = [_policy(item, p) for item in pols]
    if p["reference_budget"] not in [b for n, b in norm if n == "chunked_prefill"]:
        raise ParameterError(
            f"reference_budget ({p['reference_budget']}) must be one of the chunked_prefill "
            f"budgets in policies, so that F1.1-F1.3 compare measured runs"
        )
    if not any(n == "eager_cont_batch" for n, _ in norm):
        raise ParameterError("policies must include eager_cont_batch (the F1.1-F1.3 baseline)")


def _check_budget_sweep(p: dict) -> None:
    top = p["max_num_batched_tokens"]
    p["budget_sweep"] = check_positive_ints("budget_sweep", p["budget_sweep"], maximum=top) if p["budget_sweep"] else []
    for b in p["budget_sweep"]:
        if b < p["max_num_seqs"]:
            raise ParameterError(f"budget_sweep value {b} must be >= max_num_seqs ({p['max_num_seqs']})")
    if p["budget_sweep"]:
        _check_spec("budget_sweep_model", p["budget_sweep_model"])
        if p["budget_sweep_fraction"] not in p["rate_fractions"]:
            raise ParameterError(
                f"budget_sweep_fraction ({p['budget_sweep_fraction']}) must be one of rate_fractions "
                f"{p['rate_fractions']}: the budget sweep reuses that rate's trace"
            )


def _check_load(p: dict) -> None:
    """Rates, durations, scales and SLOs: positive numbers (lists sorted)."""
    for k in ("rate_fractions", "fallback_rates"):
        v = p[k]
        if not isinstance(v, (list, tuple)) or not v:
            raise ParameterError(f"{k} must be a non-empty list of positive numbers, got {v!r}")
        p[k] = sorted(_positive(k, x) for x in v)
    for k in POSITIVE:
        p[k] = _positive(k, p[k])
    if p["slo_ttft_ms"] is not None:
        p["slo_ttft_ms"] = _positive("slo_ttft_ms", p["slo_ttft_ms"])
    _check_slo_and_search(p)


def _check_slo_and_search(p: dict) -> None:
    slo = p["slo_itl_ms"]
    if isinstance(slo, dict):
        p["slo_itl_ms"] = {str(m): _positive(f"slo_itl_ms[{m!r}]", v) for m, v in slo.items()}
    elif slo is not None:
        p["slo_itl_ms"] = _positive("slo_itl_ms", slo)
    if p["search_factor"] <= 1:
        raise ParameterError(f"search_factor must be > 1 (the step between searched rates), got {p['search_factor']}")
    if isinstance(p["search_steps"], bool) or not isinstance(p["search_steps"], int) or p["search_steps"] < 0:
        raise ParameterError(f"search_steps must be an integer >= 0, got {p['search_steps']!r}")
    if not isinstance(p["engine_process"], bool):
        raise ParameterError(f"engine_process must be True or False, got {p['engine_process']!r}")
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise ParameterError(f"seed must be an integer, got {p['seed']!r}")


def study_params(profile: str = "auto", **overrides) -> dict:
    """The profile's defaults with the non-None overrides, validated (``ParameterError`` on bad input)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_models_and_sizes(p)
    _check_policies(p)
    _check_load(p)  # before the budget sweep, which looks its fraction up in the sorted rate_fractions
    _check_budget_sweep(p)
    _check_parts(p)
    return p


def slo_for(P: dict, model: str) -> float | None:
    """The ITL SLO (ms) of ``model``: ``slo_itl_ms``'s value for it (a dict per model, or one number), else None
    (then ``slo_itl_factor`` × the probe's decode step)."""
    slo = P["slo_itl_ms"]
    return slo.get(model) if isinstance(slo, dict) else slo


def _check_parts(p: dict) -> None:
    """``parts``: None (everything) or selectors (``sizing.select``); ``capacities``: None, a results folder, or
    req/s per model spec."""
    from servelab.studies.s01_scheduling.sizing import check_selectors

    if p["parts"] is not None:
        p["parts"] = check_selectors(p["parts"], p)
    caps = p["capacities"]
    if caps is None or isinstance(caps, str):
        return
    if not isinstance(caps, dict):
        raise ParameterError(f"capacities must be None, a results folder or {{model: req/s}}, got {caps!r}")
    p["capacities"] = {m: _positive(f"capacities[{m!r}]", v) for m, v in caps.items()}
