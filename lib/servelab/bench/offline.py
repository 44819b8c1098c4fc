"""Offline throughput: every request submitted at once, output tokens per second until the last finishes.

``offline_floor_s`` is the roofline bound for the same workload: all prompts prefilled at the matmul
ceiling, then one decode step per output position, each at ``max(FLOPs / peak, bytes / bandwidth)`` for
the requests still running (weights read once per step, every cached K/V read once). No schedule
can beat it on this GPU; its ratio to the measured time is how close the engine gets.
"""

from __future__ import annotations

import time

import numpy as np

from servelab.bench.workload import OfflineWorkload
from servelab.engine.engine import Engine
from servelab.engine.sequence import SamplingParams


def offline_params(workload: OfflineWorkload, temperature: float) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True) for n in workload.output_lens]


def run_offline(engine: Engine, workload: OfflineWorkload, *, temperature: float = 0.6, progress: bool = False) -> dict:
    """Run the workload to completion; returns output tokens, seconds and tokens/s (wall clock, synchronised).
    Raises ``RuntimeError`` if the engine did not give back every row and block of the finished requests."""
    import torch

    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    steps0, pre0 = engine.steps, engine.scheduler.num_preemptions
    sync()
    t0 = time.perf_counter()
    outs = engine.generate(workload.prompts, offline_params(workload, temperature), progress=progress)
    sync()
    elapsed = time.perf_counter() - t0
    leaked = engine.leaked()
    if leaked:  # a later run of this engine would fail once its block-table rows or KV blocks ran out
        raise RuntimeError(f"after the run, finished sequences {leaked[:8]} still hold block-table rows or KV blocks")
    produced = sum(len(o) for o in outs)
    if produced != workload.output_tokens:
        raise RuntimeError(f"the engine produced {produced} tokens, the workload asks for {workload.output_tokens}")
    return {
        "output_tokens": produced,
        "elapsed_s": elapsed,
        "tok_s": produced / elapsed,
        "steps": engine.steps - steps0,
        "preemptions": engine.scheduler.num_preemptions - pre0,
    }


def offline_floor_s(shape, workload: OfflineWorkload, roofline, dtype_bytes: int = 2) -> float:
    """Roofline lower bound on the workload's wall time in seconds (see the module docstring)."""
    prompt = np.array([len(p) for p in workload.prompts], dtype=float)
    out = np.array(workload.output_lens, dtype=float)
    prefill_flops = sum(shape.prefill_flops(int(n)) for n in prompt)
    t = float(roofline.compute_ms(prefill_flops)) / 1e3
    for k in range(1, int(out.max())):  # the first output token comes from the prefill
        active = out > k
        b = int(active.sum())
        ctx = prompt[active] + k  # tokens each running request has cached at this step
        flops = b * (
            2.0 * shape.matmul_params + 2.0 * shape.vocab * shape.hidden
        ) + 4.0 * shape.layers * shape.heads * shape.head_dim * float(ctx.sum())
        nbytes = shape.weight_bytes(dtype_bytes) + shape.kv_bytes_per_token(dtype_bytes) * float((ctx + 1).sum())
        t += float(roofline.floor_ms(flops, nbytes)) / 1e3
    return t
