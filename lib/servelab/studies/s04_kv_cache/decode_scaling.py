"""F4.2: does decode step time stay flat with context length (memory-bound), and in which regime?

The steps are timed by Study 2's sweep (``servelab.studies.s02_gpu_costs.sweep.step_sweep``) in two execution
modes: HF eager (launch-bound on a fast GPU: Python dispatches every kernel) and HF's forward replayed from a CUDA
graph (not launch-bound). The reporting path (``derived.variation_summary``) summarises, per mode and batch size,
how much the step time varies across contexts, and the bandwidth at which the extra context is read:

    variation %   = (max - min) / min × 100 over the contexts swept (the seed's measure; noise counts in it)
    trend %       = the least-squares line's rise over the contexts swept, relative to its start (noise averages out)
    marginal GB/s = 1 / slope of step time against KV bytes per step (least squares, scipy), with a 95% interval

A step that is truly memory-bound reads the KV at close to the copy ceiling; a launch-bound step shows a
flat time whose marginal GB/s is meaningless (the slope is noise).
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s02_gpu_costs.sweep import decode_points, step_sweep


def decode_context_sweep(
    model,
    model_name: str,
    modes,
    batches,
    contexts,
    roofline,
    *,
    repeats: int = 10,
    warmup: int = 3,
    max_kv_tokens: int | None = None,
) -> pd.DataFrame:
    """Decode step time for every (mode, batch, context); rows as Study 2's ``step_sweep`` plus ``kv_bytes``."""
    from servelab.studies.s04_kv_cache.bytes_per_token import KVGeometry

    kv_token = KVGeometry.from_config(model.config).kv_bytes_per_token(model.dtype.itemsize)
    cap = max_kv_tokens if max_kv_tokens is not None else max(batches) * max(contexts)
    pts = decode_points(batches, contexts, cap)
    df = step_sweep(
        model, model_name, pts, list(modes), roofline, warmup=warmup, repeats=repeats, desc=f"{model_name} decode"
    )
    df["kv_bytes"] = df["batch"] * df["context"] * kv_token
    df["kv_bytes_per_token"] = kv_token
    return df
