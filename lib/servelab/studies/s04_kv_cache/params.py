"""Study 4's parameters: profile defaults, overrides from papermill, and validation."""

from __future__ import annotations

from servelab.bench.hf_modes import MODES
from servelab.kv.compaction import MOVERS
from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)

DTYPES = ("float32", "bfloat16", "float16")

DEFAULTS = {
    "full": dict(
        seed=0,  # random weights (and traces) of this run; a set of repeats gives each its own
        # F4.1: GPT-2 in fp16 is the seed's 36 KB/token model; GQA (Qwen2, Llama-3), MQA (SantaCoder)
        bpt_cases=[
            ["config:gpt2", "float16", True],
            ["config:qwen2-0.5b", "bfloat16", True],
            ["config:qwen2-1.5b", "bfloat16", True],
            ["config:llama-3-8b", "bfloat16", True],
            ["config:gpt-bigcode-santacoder", "bfloat16", True],
        ],
        capacity_model="config:llama-3-8b",
        capacity_dtype="bfloat16",
        capacity_budget_gib=100,
        capacity_max_len=8192,
        capacity_trials=5,
        block_sizes=[16, 32, 64, 128, 256],
        decode_model="config:gpt2",
        decode_dtype="float16",
        decode_modes=["hf_eager", "hf_cuda_graph"],
        decode_batches=[1, 16, 64, 256],
        decode_contexts=[64, 128, 256, 512, 1000],
        repeats=10,
        compaction_pool_mib=[1024, 4096, 16384],
        compaction_move_fractions=[0.1, 0.5],
        compaction_methods=list(MOVERS),
        overlap_pool_mib=8192,
        overlap_block_size=16,
        overlap_move_fraction=0.5,
        overlap_batches=[1, 64],
        overlap_context=512,
        overlap_rounds=50,
    ),
    "smoke": dict(
        seed=0,  # random weights (and traces) of this run; a set of repeats gives each its own
        bpt_cases=[
            ["config:tiny-gpt2", "float32", True],
            ["config:tiny-qwen2", "float32", True],
            ["config:tiny-llama", "float32", True],
            ["config:tiny-gpt-bigcode", "float32", True],
            # full-size architectures: the pool only (no weights are initialised)
            ["config:gpt2", "float16", False],
            ["config:llama-3-8b", "bfloat16", False],
        ],
        capacity_model="config:llama-3-8b",
        capacity_dtype="bfloat16",
        capacity_budget_gib=100,
        capacity_max_len=8192,
        capacity_trials=3,
        block_sizes=[16, 64, 256],
        decode_model="config:tiny-gpt2",
        decode_dtype="float32",
        decode_modes=["hf_eager"],
        decode_batches=[1, 4],
        decode_contexts=[16, 64, 256],
        repeats=3,
        compaction_pool_mib=[4, 16],
        compaction_move_fractions=[0.1, 0.5],
        compaction_methods=list(MOVERS),
        overlap_pool_mib=16,
        overlap_block_size=16,
        overlap_move_fraction=0.5,
        overlap_batches=[2],
        overlap_context=64,
        overlap_rounds=5,
    ),
}


def _check_spec(name: str, spec) -> None:
    if not isinstance(spec, str) or not spec:
        raise ParameterError(f"{name} must be a model spec string, got {spec!r}")
    if spec.startswith(CONFIG_PREFIX) and spec[len(CONFIG_PREFIX) :] not in shipped_configs():
        raise ParameterError(f"{name}: unknown config {spec!r}; shipped: {', '.join(shipped_configs())}")


def _check_fraction(name: str, v, lo_open: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 1 if lo_open else 0 <= v <= 1):
        raise ParameterError(f"{name} must be a number in (0, 1], got {v!r}")
    return float(v)


def _check_bpt_cases(p: dict) -> None:
    cases = p["bpt_cases"]
    if not isinstance(cases, (list, tuple)) or not cases:
        raise ParameterError(f"bpt_cases must be a non-empty list of [spec, dtype, check_hf], got {cases!r}")
    norm = []
    for c in cases:
        if not isinstance(c, (list, tuple)) or len(c) != 3 or not isinstance(c[2], bool):
            raise ParameterError(f"each bpt_cases entry must be [spec, dtype, check_hf (bool)], got {c!r}")
        _check_spec("bpt_cases", c[0])
        check_choice("bpt_cases dtype", c[1], DTYPES)
        norm.append([c[0], c[1], c[2]])
    p["bpt_cases"] = norm


def _check_capacity(p: dict) -> None:
    for k in ("capacity_model", "decode_model"):
        _check_spec(k, p[k])
    for k in ("capacity_dtype", "decode_dtype"):
        check_choice(k, p[k], DTYPES)
    check_int_range("capacity_budget_gib", p["capacity_budget_gib"], 1, 4096)
    check_int_range("capacity_max_len", p["capacity_max_len"], 2, 1 << 20)
    check_int_range("capacity_trials", p["capacity_trials"], 1, 100)
    p["block_sizes"] = check_positive_ints("block_sizes", p["block_sizes"], maximum=4096)


def _check_decode(p: dict) -> None:
    if isinstance(p["decode_modes"], str):
        p["decode_modes"] = [p["decode_modes"]]
    if not p["decode_modes"]:
        raise ParameterError("decode_modes must not be empty")
    for m in p["decode_modes"]:
        check_choice("decode_modes", m, MODES)  # the engine's mode joins MODES when it lands
    import torch

    if "hf_cuda_graph" in p["decode_modes"] and not torch.cuda.is_available():
        raise ParameterError("decode mode 'hf_cuda_graph' needs a CUDA device; drop it from decode_modes on the CPU")
    p["decode_batches"] = check_positive_ints("decode_batches", p["decode_batches"], maximum=4096)
    p["decode_contexts"] = check_positive_ints("decode_contexts", p["decode_contexts"], maximum=1 << 20)
    if len(p["decode_contexts"]) < 2:
        raise ParameterError("decode_contexts needs at least two contexts to measure a variation")
    check_int_range("repeats", p["repeats"], 1, 1000)


def _check_compaction(p: dict) -> None:
    p["compaction_pool_mib"] = check_positive_ints("compaction_pool_mib", p["compaction_pool_mib"], maximum=1 << 20)
    fr = p["compaction_move_fractions"]
    if not isinstance(fr, (list, tuple)) or not fr:
        raise ParameterError(f"compaction_move_fractions must be a non-empty list, got {fr!r}")
    p["compaction_move_fractions"] = sorted({_check_fraction("compaction_move_fractions", f) for f in fr})
    if isinstance(p["compaction_methods"], str):
        p["compaction_methods"] = [p["compaction_methods"]]
    if not p["compaction_methods"]:
        raise ParameterError("compaction_methods must not be empty")
    for m in p["compaction_methods"]:
        check_choice("compaction_methods", m, MOVERS)


def _check_overlap(p: dict) -> None:
    check_int_range("overlap_pool_mib", p["overlap_pool_mib"], 1, 1 << 20)
    check_int_range("overlap_block_size", p["overlap_block_size"], 1, 4096)
    p["overlap_move_fraction"] = _check_fraction("overlap_move_fraction", p["overlap_move_fraction"])
    p["overlap_batches"] = check_positive_ints("overlap_batches", p["overlap_batches"], maximum=4096)
    check_int_range("overlap_context", p["overlap_context"], 1, 1 << 20)
    check_int_range("overlap_rounds", p["overlap_rounds"], 3, 10000)


def _check_positions(p: dict) -> None:
    """A position past the model's table is a device-side assert on CUDA, which kills the whole run: refuse it."""
    from servelab.studies.common.quiet import quiet_run
    from servelab.studies.s04_kv_cache.bytes_per_token import model_config

    with quiet_run():  # the first transformers import happens here, in a notebook's (removed) parameters step
        cfg = model_config(p["decode_model"])
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    longest = max(max(p["decode_contexts"]), p["overlap_context"])
    if max_pos is not None and longest + 1 > max_pos:
        raise ParameterError(
            f"{p['decode_model']} has {max_pos} positions; decode_contexts and overlap_context "
            f"must stay below {max_pos} (got {longest})"
        )


def study_params(profile: str = "auto", **overrides) -> dict:
    """The profile's defaults with the non-None overrides, validated (``ParameterError`` on bad input)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_bpt_cases(p)
    _check_capacity(p)
    _check_decode(p)
    _check_compaction(p)
    _check_overlap(p)
    _check_positions(p)
    check_int_range("seed", p["seed"], 0, 2**31 - 1)
    return p
