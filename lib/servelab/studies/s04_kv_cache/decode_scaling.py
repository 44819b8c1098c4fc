"""F4.2: does decode step time stay flat with context length (memory-bound), and in which regime?

The steps are timed by Study 2's sweep (``servelab.studies.s02_gpu_costs.step_sweep``) in two execution modes: HF eager
(launch-bound on a fast GPU: Python dispatches every kernel) and HF's forward replayed from a CUDA graph
(not launch-bound). Here we summarise, per mode and batch size, how much the step time varies across
contexts, and the bandwidth at which the extra context is read:

    variation %   = (max - min) / min × 100 over the contexts swept (the seed's measure; noise counts in it)
    trend %       = the least-squares line's rise over the contexts swept, relative to its start (noise averages out)
    marginal GB/s = 1 / slope of step time against KV bytes per step (least squares, scipy), with a 95% interval

A step that is truly memory-bound reads the KV at close to the copy ceiling; a launch-bound step shows a
flat time whose marginal GB/s is meaningless (the slope is noise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

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


def variation_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (model, mode, batch): % variation of step time over context, and the marginal KV read bandwidth."""
    rows = []
    ok = steps[steps["status"] == "ok"]
    for (model, mode, batch), g in ok.groupby(["model", "mode", "batch"]):
        g = g.sort_values("context")
        if len(g) < 2:
            continue
        t = g["median_ms"].to_numpy()
        kv = g["kv_bytes"].to_numpy(dtype=float)
        fit = stats.linregress(kv, t)
        marginal, lo, hi = _marginal_gb_s(fit, len(g))
        fitted_first = fit.intercept + fit.slope * kv[0]
        kv_share = (g["kv_bytes"] / g["bytes"]).iloc[-1]
        rows.append(
            dict(
                model=model,
                mode=mode,
                batch=batch,
                contexts=len(g),
                context_min=int(g["context"].min()),
                context_max=int(g["context"].max()),
                ms_min=float(t.min()),
                ms_max=float(t.max()),
                variation_pct=100.0 * (t.max() - t.min()) / t.min(),
                ms_at_min_context=float(t[0]),
                ms_at_max_context=float(t[-1]),
                growth_pct=100.0 * (t[-1] - t[0]) / t[0],
                trend_pct=100.0 * fit.slope * (kv[-1] - kv[0]) / fitted_first,
                marginal_kv_gb_s=marginal,
                marginal_kv_gb_s_low=lo,
                marginal_kv_gb_s_high=hi,
                fit_r2=fit.rvalue**2,
                achieved_gb_s_at_max_context=float(g["achieved_gb_s"].iloc[-1]),
                pct_of_floor_at_max_context=float(g["pct_of_floor"].iloc[-1]),
                kv_share_of_bytes_at_max_context=float(kv_share),
            )
        )
    return pd.DataFrame(rows)


def _marginal_gb_s(fit, n: int) -> tuple[float, float, float]:
    """1 / slope in GB/s, with the 95% interval from the slope's standard error (NaN where the slope may be <= 0)."""
    t = stats.t.ppf(0.975, n - 2) if n > 2 else np.nan
    to_gb_s = lambda slope: 1.0 / (slope * 1e-3) / 1e9 if slope > 0 else np.nan  # noqa: E731  (ms/byte -> GB/s)
    lo_slope, hi_slope = fit.slope - t * fit.stderr, fit.slope + t * fit.stderr
    return to_gb_s(fit.slope), to_gb_s(hi_slope), to_gb_s(lo_slope) if lo_slope > 0 else np.inf
