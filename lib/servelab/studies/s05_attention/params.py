"""Study 5's parameters: profile defaults (full on the H200, smoke on two CPU cores) and validation.

The full profile is sized for about three minutes on an H200: naive and math attention grow as L² in
time and memory, so they are cut off by OOM or by ``max_call_ms``; FlexAttention compiles one kernel per
(mask, length), so the mask sweep uses few lengths.
"""

from __future__ import annotations

from servelab.models.loader import shipped_configs
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)
from servelab.studies.s05_attention.variants import VARIANTS

SEED_COMPARISON_LENGTH = 2048  # F5.1: the seed's comparison point, tokens
SEED_GROWTH = 32  # F5.2: the seed's length growth, ×

DEFAULTS = {
    "full": dict(
        dtype="bfloat16",
        models=["qwen2-1.5b", "llama-3-8b"],
        head_dims=[64, 128],
        prefill_lengths=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        variants=["naive", "sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "sdpa_repeat_kv"],
        decode_kv_lens=[128, 512, 2048, 8192, 32768, 131072],
        decode_batches=[1, 8, 64, 256],
        max_kv_gib=8.0,
        mask_model="llama-3-8b",
        mask_lengths=[2048, 8192, 32768],
        mask_variants=["sdpa_default", "flex"],
        window=1024,
        document_tokens=1024,
        growth_pairs=[[256, 8192], [1024, 32768]],
        target_ms=150.0,
        max_repeats=30,
        warmup=2,
        max_call_ms=1500.0,
        long_from=8192,
        small_batch=8,
        seed=0,  # the random inputs (q, k, v) and the document mask's lengths; a set of repeats gives each its own
    ),
    "smoke": dict(
        dtype="float32",
        models=["tiny-qwen2", "tiny-llama"],
        head_dims=[16, 32],
        prefill_lengths=[64, 256, 2048],
        variants=["naive", "sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "sdpa_repeat_kv"],
        decode_kv_lens=[64, 512, 4096],
        decode_batches=[1, 8],
        max_kv_gib=0.25,
        mask_model="tiny-llama",
        mask_lengths=[128, 512],
        mask_variants=["sdpa_default", "flex"],
        window=32,
        document_tokens=64,
        growth_pairs=[[64, 2048]],
        target_ms=5.0,
        max_repeats=3,
        warmup=1,
        max_call_ms=400.0,
        long_from=2048,
        small_batch=1,
        seed=0,  # the random inputs (q, k, v) and the document mask's lengths; a set of repeats gives each its own
    ),
}
DTYPES = ("bfloat16", "float16", "float32")


def _check_variants(name: str, values) -> list[str]:
    if isinstance(values, str) or not values:
        raise ParameterError(f"{name} must be a non-empty list of variant names from {tuple(VARIANTS)}")
    for v in values:
        check_choice(name, v, VARIANTS)
    return list(dict.fromkeys(values))


def _check_models(name: str, values) -> list[str]:
    have = shipped_configs()
    if isinstance(values, str) or not values:
        raise ParameterError(f"{name} must be a non-empty list of shipped configs from {have}")
    for m in values:
        check_choice(name, m, have)
    return list(dict.fromkeys(values))


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ParameterError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _check_growth_pairs(pairs, lengths) -> list[list[int]]:
    """Each F5.2 pair is [L, 32·L] with both lengths in the prefill sweep."""
    out = []
    for pair in pairs:
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in pair)
            or pair[1] != SEED_GROWTH * pair[0]
        ):
            raise ParameterError(f"each growth pair must be [L, {SEED_GROWTH}·L] (the seed's growth), got {pair!r}")
        if not set(pair) <= set(lengths):
            raise ParameterError(f"growth pair {pair} needs both lengths in prefill_lengths {lengths}")
        out.append(list(pair))
    return out


def _check_numbers(p: dict) -> None:
    """The sizes (lists of positive ints, single positive ints, positive floats), normalised in place."""
    for k in ("head_dims", "prefill_lengths", "decode_kv_lens", "decode_batches", "mask_lengths"):
        p[k] = check_positive_ints(k, p[k], maximum=256 if k == "head_dims" else 2**20)
    for k in ("window", "document_tokens", "max_repeats", "warmup", "long_from", "small_batch"):
        p[k] = check_positive_ints(k, [p[k]])[0]
    for k in ("max_kv_gib", "target_ms", "max_call_ms"):
        p[k] = _check_positive(k, p[k])
    check_int_range("seed", p["seed"], 0, 2**31 - 1)


def study_params(profile: str = "auto", **overrides) -> dict:
    """The profile's defaults with every non-None override validated (``ParameterError`` says what is wrong)."""
    p = resolve(DEFAULTS, profile, overrides)
    check_choice("dtype", p["dtype"], DTYPES)
    p["models"] = _check_models("models", p["models"])
    check_choice("mask_model", p["mask_model"], shipped_configs())
    _check_numbers(p)
    p["variants"] = _check_variants("variants", p["variants"])
    p["mask_variants"] = _check_variants("mask_variants", p["mask_variants"])
    if SEED_COMPARISON_LENGTH not in p["prefill_lengths"]:
        raise ParameterError(
            f"prefill_lengths must include {SEED_COMPARISON_LENGTH}, the seed's comparison point (F5.1)"
        )
    p["growth_pairs"] = _check_growth_pairs(p["growth_pairs"], p["prefill_lengths"])
    return p
