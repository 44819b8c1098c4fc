"""What one run of ``python -m servelab.bench`` measures: the plan (models, points, sizes) and its time budget."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchPlan:
    model: str
    mfu_model: str
    dtype: str
    device: str
    decode_points: tuple[tuple[int, int], ...]  # (batch, context)
    mfu_tokens: int
    num_requests: int
    min_len: int
    max_len: int
    hf_batch: int
    hf_budget_s: float
    exactness_models: tuple[str, ...]
    exactness_prompts: int
    exactness_steps: int
    repeats: int
    time_budget_s: float
    seed: int
    extra_settings: bool = True  # also measure labelled non-default settings (eager blocks, async off)
    # the labelled offline_tok_s_decode_steps8 row; on in the smoke too, where it checks multi-step decoding end to end
    multi_step_row: bool = True
    offline_budget: int = 512  # max_num_batched_tokens of the offline_tok_s_budget{N} row
    # timed runs of each offline setting on one engine (an odd count: the median is one run's): a single run read a
    # switch 3% faster than the default on an H100, inside what the default's own runs spread
    offline_repeats: int = 3
    mixed_step: tuple[int, int, int] = (63, 512, 512)  # (decodes, their context, the prefill chunk's tokens)
    e2e_model: str | None = None  # model of the e2e_ms_per_token_b1 row (None: ``model``)
    e2e_tokens: tuple[int, int] = (128, 256)  # (prompt, output) tokens of its one request
    # decode points also timed with fused_rope_kv_write=False, each a labelled row decode_ms_b{B}_ctx{C}_unfused_rope_kv
    # (CUDA with Triton only: elsewhere the default is already unfused, and the row left out)
    fused_rope_kv_points: tuple[tuple[int, int], ...] = ((1, 128), (64, 512))


def make_plan(args) -> BenchPlan:
    import torch

    if args.smoke:
        return BenchPlan(
            "config:tiny-qwen2",
            "config:tiny-llama",
            "float32",
            "cpu",
            ((1, 16), (4, 32), (1, 256)),
            128,
            args.num_requests or 8,
            8,
            24,
            8,
            2.0,
            ("config:tiny-gpt2",),
            2,
            8,
            3,
            args.time_budget,
            args.seed,
            extra_settings=False,
            offline_budget=32,
            mixed_step=(3, 16, 16),
            e2e_tokens=(8, 16),
            fused_rope_kv_points=(),  # the CPU runs no fused kernel (outside Triton's interpreter)
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    quick = args.quick
    return BenchPlan(
        args.model,
        args.mfu_model,
        args.dtype,
        device,
        ((1, 128), (64, 512), (1, 16384)),
        args.mfu_tokens,
        args.num_requests or 256,
        args.min_len,
        args.max_len,
        args.hf_batch,
        10.0 if quick else 20.0,
        _exactness_models(quick),
        4,
        32,
        10 if quick else 30,
        args.time_budget,
        args.seed,
        e2e_model=args.e2e_model,
    )


def _exactness_models(quick: bool) -> tuple[str, ...]:
    """Models checked against HF beside the benchmarked one: SmolLM2-135M-Instruct, trained weights (random weights
    make near-ties rare and hide bugs), wherever its GGUF is installed; GPT-2's shape in a full run."""
    from servelab.models.loader import SMOLLM2, ModelLoadError, smollm2_gguf

    try:
        smollm2_gguf()
        trained = (SMOLLM2,)
    except ModelLoadError:  # the package is not installed here: the row is left out, and the log says so
        print("exactness: SmolLM2-135M-Instruct's GGUF is not installed; its row is left out")
        trained = ()
    return trained if quick else ("config:gpt2", *trained)


class Clock:
    """Seconds left of the run's budget; late sections are skipped when it runs low."""

    def __init__(self, budget_s: float):
        self.t0, self.budget = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)
