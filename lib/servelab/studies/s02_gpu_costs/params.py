"""Study 2's parameters: profile defaults, overrides from papermill, and validation."""

from __future__ import annotations

from servelab.bench.hf_modes import MODES
from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)

DEFAULTS = {
    "full": dict(
        seed=0,  # random weights (and traces) of this run; a set of repeats gives each its own
        models=["config:qwen2-0.5b", "config:qwen2-1.5b"],
        dtype="bfloat16",
        modes=["hf_eager", "hf_cuda_graph", "engine", "engine_eager"],
        prefill_lengths=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
        # steps over 16,384 tokens are compute-bound like those below, and no server step is that large
        prefill_batches=[1, 4, 16],
        max_batch_tokens=16384,
        decode_batches=[1, 4, 16, 64, 256],
        decode_contexts=[128, 512, 2048, 8192, 16384],
        max_kv_gib=16,
        repeats=7,
        chunk_tokens=[128, 512],
        chunk_contexts=[512, 2048],
        mixed_decodes=[16, 64],
        mixed_decode_context=512,
        mixed_chunk_tokens=512,
        mixed_chunk_contexts=[0, 1024],
        engine_eager_max_tokens=4096,
    ),
    "smoke": dict(
        seed=0,  # random weights (and traces) of this run; a set of repeats gives each its own
        models=["config:tiny-qwen2", "config:tiny-llama"],
        dtype="float32",
        modes=["hf_eager", "engine", "engine_eager"],
        prefill_lengths=[16, 128],
        prefill_batches=[1, 2],
        max_batch_tokens=512,
        decode_batches=[1, 4],
        decode_contexts=[16, 128],
        max_kv_gib=1,
        repeats=3,
        chunk_tokens=[8, 32],
        chunk_contexts=[32],
        mixed_decodes=[2, 4],
        mixed_decode_context=16,
        mixed_chunk_tokens=16,
        mixed_chunk_contexts=[0, 32],
        engine_eager_max_tokens=256,
    ),
}


def _non_negative_ints(name: str, values) -> list[int]:
    """A non-empty list of integers >= 0, sorted and de-duplicated."""
    values = [values] if isinstance(values, int) and not isinstance(values, bool) else values
    if (
        isinstance(values, str)
        or not isinstance(values, (list, tuple))
        or not values
        or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 20 for v in values)
    ):
        raise ParameterError(f"{name} must be a non-empty list of integers in [0, {1 << 20}], got {values!r}")
    return sorted(set(values))


POSITIVE_LISTS = (
    "prefill_lengths",
    "prefill_batches",
    "decode_batches",
    "decode_contexts",
    "chunk_tokens",
    "chunk_contexts",
    "mixed_decodes",
)


def _check_models(p: dict) -> None:
    if isinstance(p["models"], str):
        p["models"] = [p["models"]]
    if not p["models"] or not all(isinstance(m, str) and m for m in p["models"]):
        raise ParameterError(f"models must be a non-empty list of model specs, got {p['models']!r}")
    for m in p["models"]:
        if m.startswith(CONFIG_PREFIX) and m[len(CONFIG_PREFIX) :] not in shipped_configs():
            raise ParameterError(f"unknown config {m!r}; shipped: {', '.join(shipped_configs())}")
    check_choice("dtype", p["dtype"], ("bfloat16", "float16", "float32"))


def _check_modes(p: dict) -> None:
    if isinstance(p["modes"], str):
        p["modes"] = [p["modes"]]
    for mode in p["modes"]:
        check_choice("mode", mode, MODES)
    import torch

    if "hf_cuda_graph" in p["modes"] and not torch.cuda.is_available():
        raise ParameterError("mode 'hf_cuda_graph' needs a CUDA device; drop it from modes on the CPU")


def _check_shapes(p: dict) -> None:
    for k in POSITIVE_LISTS:
        p[k] = check_positive_ints(k, p[k], maximum=1 << 20)
    p["mixed_chunk_contexts"] = _non_negative_ints(
        "mixed_chunk_contexts", p["mixed_chunk_contexts"]
    )  # 0: a first chunk
    # with a cached chunk context the decodes are prepared one token short, so they need 2 tokens of context
    check_int_range("mixed_decode_context", p["mixed_decode_context"], 2, 1 << 20)
    check_int_range("mixed_chunk_tokens", p["mixed_chunk_tokens"], 1, 1 << 20)
    for k in ("max_batch_tokens", "max_kv_gib", "repeats", "engine_eager_max_tokens"):
        check_int_range(k, p[k], 1, 1 << 30)


def study_params(profile: str = "auto", **overrides) -> dict:
    """The profile's defaults with the non-None overrides, validated (``ParameterError`` on bad input)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_models(p)
    _check_modes(p)
    _check_shapes(p)
    check_int_range("seed", p["seed"], 0, 2**31 - 1)
    return p
