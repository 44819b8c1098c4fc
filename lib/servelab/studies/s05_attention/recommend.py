"""Which kernel to use for which shape: a recommendation table computed from the sweeps.

For each regime (short or long prefill, decode at small or large batch, each masked prefill), every
variant's time is divided by the fastest correct time at the same shape; the variant with the smallest
geometric-mean ratio among those that ran on every shape of the regime is recommended.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

SHAPE_KEYS = ["arch", "head_dim", "batch", "q_len", "kv_len", "mask_label"]


def rank_variants(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant over the shapes of ``df``: geometric-mean slowdown against the best at each shape,
    shapes where it ran, median % of the roofline floor, and the SDPA backends it ran on."""
    ok = df[df["status"].eq("ok")].copy()
    shapes = ok[SHAPE_KEYS].drop_duplicates().shape[0]  # shapes some variant ran (not those over a budget)
    if ok.empty:
        return pd.DataFrame(columns=["variant", "slowdown", "shapes_ran", "shapes", "pct_of_floor", "backends"])
    ok["median_ms"] = ok["median_ms"].astype(float)
    ok["slowdown"] = ok["median_ms"] / ok.groupby(SHAPE_KEYS)["median_ms"].transform("min")
    out = (
        ok.groupby("variant")
        .agg(
            slowdown=("slowdown", lambda s: float(stats.gmean(s))),
            shapes_ran=("slowdown", "size"),
            pct_of_floor=("pct_of_floor", "median"),
            backends=("backend", lambda s: ", ".join(sorted({b for b in s if isinstance(b, str) and b}))),
        )
        .reset_index()
    )
    out["shapes"] = shapes
    return out.sort_values(["shapes_ran", "slowdown"], ascending=[False, True]).reset_index(drop=True)


def recommend(regimes: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per regime: the recommended variant, the runner-up, how much slower naive is, % of floor."""
    rows = []
    for regime, df in regimes.items():
        r = rank_variants(df)
        full = r[r["shapes_ran"].eq(r["shapes"])]
        if full.empty:
            continue
        best = full.iloc[0]
        rest = full.iloc[1:]
        naive = r[r["variant"].eq("naive")]
        rows.append(
            dict(
                regime=regime,
                shapes=int(best["shapes"]),
                recommended=best["variant"],
                backend=best["backends"],
                slowdown_vs_best_per_shape=best["slowdown"],
                pct_of_floor=best["pct_of_floor"],
                runner_up=rest.iloc[0]["variant"] if len(rest) else "",
                runner_up_slowdown=rest.iloc[0]["slowdown"] if len(rest) else np.nan,
                naive_slowdown=float(naive["slowdown"].iloc[0]) if len(naive) else np.nan,
                not_everywhere=", ".join(r.loc[r["shapes_ran"] < r["shapes"], "variant"]),
            )
        )
    return pd.DataFrame(rows)


def regimes(
    prefill: pd.DataFrame, decode: pd.DataFrame, masks: pd.DataFrame, *, long_from: int, small_batch: int
) -> dict[str, pd.DataFrame]:
    """The shapes of each regime, named with the thresholds used."""
    out = {
        f"prefill, causal, < {long_from:,} tokens": prefill[prefill["q_len"] < long_from],
        f"prefill, causal, ≥ {long_from:,} tokens": prefill[prefill["q_len"] >= long_from],
        f"decode, batch ≤ {small_batch}": decode[decode["batch"] <= small_batch],
        f"decode, batch > {small_batch}": decode[decode["batch"] > small_batch],
    }
    for kind, g in masks.groupby("mask"):
        if kind == "causal":  # FlexAttention's causal kernel against every SDPA backend, same shapes
            same = prefill.merge(g[["arch", "head_dim", "q_len"]].drop_duplicates(), on=["arch", "head_dim", "q_len"])
            both = pd.concat([same, g], ignore_index=True).drop_duplicates(SHAPE_KEYS + ["variant"])
            out["prefill, causal, with FlexAttention"] = both
        else:
            out[f"prefill, {kind.replace('_', ' ')} mask"] = g
    return {k: v for k, v in out.items() if not v.empty}
