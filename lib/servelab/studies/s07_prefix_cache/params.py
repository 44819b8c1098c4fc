"""Study 7's parameters: profile defaults, overrides from papermill, and validation.

``full`` is sized for the H200 (about 150 s of wall time in all, model load and graph capture included);
``smoke`` for two CPU cores (tiny model, a minute or so). ``serve_engine_process`` (both: True) serves the
server-level runs from an engine in a process of its own, as Study 1 does; False steps the notebook's engine
in a thread of the notebook's process, beside the HTTP server (how Study 7 ran before 2026-12-03).
"""

from __future__ import annotations

from servelab.engine.policies import POLICIES
from servelab.kv.prefix_cache import EVICTION_POLICIES
from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)
from servelab.studies.s07_prefix_cache.simulate import POLICY_NAMES

DTYPES = ("float32", "bfloat16", "float16")
SERVE_MODES = ("http", "skip")

DEFAULTS = {
    "full": dict(
        model="config:qwen2-0.5b",
        dtype="bfloat16",
        block_size=16,
        num_blocks=32768,
        max_num_seqs=64,
        max_num_batched_tokens=16384,
        scheduler="chunked_prefill",
        eviction="lru",
        warmup=2,
        repeats=7,
        # F7.1: a shared prefix (system prompt, document) then a short question
        prefix_lengths=[64, 128, 256, 512, 1024, 2048, 4096, 8192],
        suffix_tokens=32,
        # F7.2: a conversation; each turn's prompt is the whole history plus a new user message
        turns=12,
        system_tokens=256,
        user_tokens=128,
        reply_tokens=64,
        turn_repeats=2,
        # F7.3: n requests with one common prefix of p tokens, each with its own suffix
        share_prefixes=[128, 512, 2048],
        share_batches=[1, 2, 4, 8, 12, 16, 32],
        # F7.4: the policy simulator (CPU)
        sim_alphas=[0.6, 0.8, 1.0, 1.2, 1.5, 2.0],
        sim_capacities=[1, 2, 3, 4, 8, 16, 32, 64],
        sim_policies=["lru", "lfu", "lfu_perfect", "radix", "belady"],
        sim_prefixes=100,
        sim_requests=10000,
        # server level: Zipf-popular system prompts over HTTP, caching off then on
        serve="http",
        serve_requests=256,
        serve_rate=64.0,
        serve_prefixes=8,
        serve_alpha=1.0,
        serve_prefix_tokens=2048,
        serve_suffix_tokens=64,
        serve_output_tokens=32,
        serve_deadline_s=20.0,
        serve_run_estimate_s=8.0,
        # the engine process's build and graph capture (4-23 s on the H200 in the 7214f6574161 runs), and the
        # warm-up request: the sweeps leave it and the four runs (the budget had left none, and repeat 0 skipped
        # its burst runs at 122.9 of 125 s)
        serve_build_estimate_s=30.0,
        serve_engine_process=True,
        time_budget_s=200.0,
        seed=0,
    ),
    "smoke": dict(
        model="config:tiny-llama",
        dtype="float32",
        block_size=16,
        num_blocks=2048,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        scheduler="chunked_prefill",
        eviction="lru",
        warmup=1,
        repeats=3,
        prefix_lengths=[16, 64, 256],
        suffix_tokens=8,
        turns=10,
        system_tokens=32,
        user_tokens=16,
        reply_tokens=8,
        turn_repeats=1,
        share_prefixes=[32, 128],
        share_batches=[1, 2, 4, 8],
        sim_alphas=[1.0, 2.0],
        sim_capacities=[1, 2, 4, 8],
        sim_policies=["lru", "lfu", "lfu_perfect", "radix"],
        sim_prefixes=50,
        sim_requests=2000,
        serve="http",
        serve_requests=24,
        serve_rate=20.0,
        serve_prefixes=3,
        serve_alpha=1.0,
        serve_prefix_tokens=64,
        serve_suffix_tokens=8,
        serve_output_tokens=4,
        serve_deadline_s=30.0,
        serve_run_estimate_s=5.0,
        serve_build_estimate_s=10.0,
        serve_engine_process=True,
        time_budget_s=600.0,
        seed=0,
    ),
}


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply non-None overrides, and validate everything (``ParameterError`` on bad input)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_model(p)
    _check_engine(p)
    _check_sizes(p)
    _check_rates(p)
    _check_simulator(p)
    _check_fits(p)
    return p


def _check_model(p: dict) -> None:
    if not isinstance(p["model"], str) or not p["model"]:
        raise ParameterError(f"model must be a model spec string, got {p['model']!r}")
    if p["model"].startswith(CONFIG_PREFIX) and p["model"][len(CONFIG_PREFIX) :] not in shipped_configs():
        raise ParameterError(f"model: unknown config {p['model']!r}; shipped: {', '.join(shipped_configs())}")
    check_choice("dtype", p["dtype"], DTYPES)


def _check_engine(p: dict) -> None:
    """The engine's limits and policies, the timing repeats and the seed."""
    check_choice("scheduler", p["scheduler"], tuple(POLICIES))
    check_choice("eviction", p["eviction"], EVICTION_POLICIES)
    check_choice("serve", p["serve"], SERVE_MODES)
    if not isinstance(p["serve_engine_process"], bool):
        raise ParameterError(f"serve_engine_process must be True or False, got {p['serve_engine_process']!r}")
    check_int_range("block_size", p["block_size"], 1, 256)
    check_int_range("num_blocks", p["num_blocks"], 16, 1 << 24)
    check_int_range("max_num_seqs", p["max_num_seqs"], 1, 1024)
    check_int_range("max_num_batched_tokens", p["max_num_batched_tokens"], p["max_num_seqs"], 1 << 20)
    check_int_range("warmup", p["warmup"], 0, 100)
    check_int_range("repeats", p["repeats"], 1, 1000)
    check_int_range("turn_repeats", p["turn_repeats"], 1, 100)
    check_int_range("seed", p["seed"], 0, 2**31 - 1)


_TOKEN_COUNTS = (
    "suffix_tokens",
    "system_tokens",
    "user_tokens",
    "reply_tokens",
    "serve_prefix_tokens",
    "serve_suffix_tokens",
    "serve_output_tokens",
)


def _check_sizes(p: dict) -> None:
    """Token counts and request counts (ints, in range), the swept lists sorted and de-duplicated."""
    for k in ("prefix_lengths", "share_prefixes", "share_batches", "sim_capacities"):
        p[k] = check_positive_ints(k, p[k], maximum=1 << 20)
    for k in _TOKEN_COUNTS:
        check_int_range(k, p[k], 1, 1 << 20)
    check_int_range("turns", p["turns"], 2, 100)
    check_int_range("sim_prefixes", p["sim_prefixes"], 1, 1 << 20)
    check_int_range("sim_requests", p["sim_requests"], 1, 10**7)
    check_int_range("serve_requests", p["serve_requests"], 1, 10**6)
    check_int_range("serve_prefixes", p["serve_prefixes"], 1, 10**5)


def _check_rates(p: dict) -> None:
    """Rates, the Zipf exponent, deadlines and budgets: positive finite numbers, stored as floats."""
    for k in (
        "serve_rate",
        "serve_alpha",
        "serve_deadline_s",
        "serve_run_estimate_s",
        "serve_build_estimate_s",
        "time_budget_s",
    ):
        v = p[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ParameterError(f"{k} must be a positive finite number, got {v!r}")
        p[k] = float(v)


def _check_simulator(p: dict) -> None:
    """F7.4's Zipf exponents and cache policies."""
    alphas = p["sim_alphas"]
    if (
        not isinstance(alphas, (list, tuple))
        or not alphas
        or any(isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < 100 for a in alphas)
    ):
        raise ParameterError(f"sim_alphas must be a non-empty list of Zipf exponents in (0, 100), got {alphas!r}")
    p["sim_alphas"] = sorted({float(a) for a in alphas})
    pol = p["sim_policies"]
    if isinstance(pol, str) or not isinstance(pol, (list, tuple)) or not pol:
        raise ParameterError(f"sim_policies must be a non-empty list of {POLICY_NAMES}, got {pol!r}")
    for name in pol:
        check_choice("sim_policies", name, POLICY_NAMES)
    p["sim_policies"] = list(dict.fromkeys(pol))


def _check_fits(p: dict) -> None:
    """Every request fits the engine: the longest prompt plus its output within the pool and the model's positions."""
    p["max_model_len"] = max_model_len(p)
    if p["max_model_len"] > p["num_blocks"] * p["block_size"]:
        raise ParameterError(
            f"num_blocks × block_size = {p['num_blocks'] * p['block_size']:,} tokens cannot hold "
            f"the longest request ({p['max_model_len']:,} tokens)"
        )
    from servelab.studies.s04_kv_cache.bytes_per_token import model_config

    cfg = model_config(p["model"])
    positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if positions is not None and p["max_model_len"] > positions:
        raise ParameterError(
            f"{p['model']} has {positions} positions; the longest request here needs "
            f"{p['max_model_len']} (shorten prefix_lengths, turns or messages)"
        )


def conversation_tokens(p: dict) -> int:
    """Tokens of the last turn's prompt plus its reply."""
    return p["system_tokens"] + p["turns"] * (p["user_tokens"] + p["reply_tokens"])


def max_model_len(p: dict) -> int:
    """The longest request any part of the study sends (prompt + output tokens), rounded up to a block."""
    longest = max(
        max(p["prefix_lengths"]) + p["suffix_tokens"] + 1,
        conversation_tokens(p),
        max(p["share_prefixes"]) + p["suffix_tokens"] + 1,
        p["serve_prefix_tokens"] + p["serve_suffix_tokens"] + p["serve_output_tokens"],
    )
    bs = p["block_size"]
    return -(-longest // bs) * bs
