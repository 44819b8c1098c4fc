"""Study 4's derived tables, computed by the reporting path from the raw ones a run wrote: the variation of decode
step time over context (F4.2), the overlap experiment's summary with its bootstrap intervals (F4.4), and one mover's
time over another's (F4.3). None of them is a measurement: changing one makes no data stale.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats


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


def _ratio_ci(a, b, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap CI of median(a) / median(b) (independent samples)."""
    res = stats.bootstrap(
        (np.asarray(a), np.asarray(b)),
        lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        vectorized=True,
        paired=False,
        n_resamples=2000,
        method="percentile",
        random_state=seed,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def overlap_summary(runs: pd.DataFrame) -> dict:
    """The numbers the verdict needs, with their uncertainty (and the ``prioritised_*`` ones where measured).

    - ``compaction_speedup`` = median compaction time alone / during decode (> 1: faster during decode), its
      95% bootstrap CI and a two-sided Mann-Whitney p-value;
    - ``wall_saving_pct`` = 1 - median total concurrent / median total serialised (the overlap's gain), CI, p;
    - ``decode_slowdown`` = median decode time concurrent / alone;
    - ``overlap_pct`` = wall time saved / the shorter of the two parts alone (100%: the shorter part fully hidden);
    - ``after_decode_speedup`` = compaction alone (started on an idle GPU) / compaction right after decode, CI.
    """
    g = {c: d for c, d in runs.groupby("condition")}
    med = {c: d.median(numeric_only=True) for c, d in g.items()}

    def compaction_speedup(condition: str, name: str) -> dict:
        lo, hi = _ratio_ci(g["compaction_alone"]["compaction_ms"], g[condition]["compaction_ms"])
        ratio = med["compaction_alone"]["compaction_ms"] / med[condition]["compaction_ms"]
        return {name: ratio, f"{name}_ci_low": lo, f"{name}_ci_high": hi}

    def wall_saving(condition: str, prefix: str = "") -> dict:
        lo, hi = _ratio_ci(g[condition]["total_ms"], g["serialised"]["total_ms"])
        return {
            f"{prefix}wall_saving_pct": 100.0 * (1 - med[condition]["total_ms"] / med["serialised"]["total_ms"]),
            f"{prefix}wall_saving_ci_low_pct": 100.0 * (1 - hi),
            f"{prefix}wall_saving_ci_high_pct": 100.0 * (1 - lo),
        }

    out = dict(
        rounds=int(runs["round"].nunique()),
        compaction_alone_ms=med["compaction_alone"]["compaction_ms"],
        decode_alone_ms=med["decode_alone"]["decode_ms"],
        serialised_total_ms=med["serialised"]["total_ms"],
        # the compaction of `serialised` starts right behind the decode, on a GPU that is already busy
        compaction_after_decode_ms=med["serialised"]["compaction_ms"],
        **compaction_speedup("serialised", "after_decode_speedup"),
    )
    if "concurrent" not in g:
        return out
    c_alone, c_conc = g["compaction_alone"]["compaction_ms"], g["concurrent"]["compaction_ms"]
    t_ser, t_conc = g["serialised"]["total_ms"], g["concurrent"]["total_ms"]
    saved = med["serialised"]["total_ms"] - med["concurrent"]["total_ms"]
    out.update(
        compaction_concurrent_ms=med["concurrent"]["compaction_ms"],
        decode_concurrent_ms=med["concurrent"]["decode_ms"],
        concurrent_total_ms=med["concurrent"]["total_ms"],
        **compaction_speedup("concurrent", "compaction_speedup"),
        compaction_p_value=float(stats.mannwhitneyu(c_alone, c_conc, alternative="two-sided").pvalue),
        **wall_saving("concurrent"),
        wall_p_value=float(stats.mannwhitneyu(t_ser, t_conc, alternative="two-sided").pvalue),
        decode_slowdown=med["concurrent"]["decode_ms"] / med["decode_alone"]["decode_ms"],
        overlap_pct=100.0 * saved / min(med["compaction_alone"]["compaction_ms"], med["decode_alone"]["decode_ms"]),
    )
    if "concurrent_prioritised" in g:
        p = med["concurrent_prioritised"]
        out.update(
            prioritised_compaction_ms=p["compaction_ms"],
            prioritised_decode_ms=p["decode_ms"],
            prioritised_total_ms=p["total_ms"],
            prioritised_compaction_speedup=med["compaction_alone"]["compaction_ms"] / p["compaction_ms"],
            prioritised_decode_slowdown=p["decode_ms"] / med["decode_alone"]["decode_ms"],
            **wall_saving("concurrent_prioritised", prefix="prioritised_"),
        )
    return out


def mover_ratio(comp: pd.DataFrame, slow: str = "block_loop", fast: str = "gather_scatter") -> pd.DataFrame:
    """Per (pool, block size, fraction moved): mover ``slow``'s time over mover ``fast``'s (> 1: ``slow`` is slower)."""
    ok = comp[(comp["status"] == "ok") & comp["method"].isin([slow, fast])]
    cols = ["pool_mib", "block_size", "move_fraction", "blocks_moved"]
    if ok.empty or set(ok["method"]) != {slow, fast}:
        return pd.DataFrame(columns=cols + ["ratio"])
    wide = ok.pivot_table(index=cols, columns="method", values="median_ms").dropna()
    return (wide[slow] / wide[fast]).rename("ratio").reset_index()
