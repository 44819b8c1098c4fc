"""Tables the page shows next to the figures: outcomes per variant, where variants ran out of memory,
and GQA done natively (``enable_gqa``) against repeating K/V heads."""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.s05_attention.verdicts import config_label


def outcomes(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: points per status and the worst relative error against the float64 reference."""
    counts = df.pivot_table(index="variant", columns="status", values="q_len", aggfunc="size", fill_value=0)
    worst = df.groupby("variant")["rel_error"].max().rename("max_rel_error")
    tol = df.groupby("variant")["tolerance"].max().rename("tolerance")
    out = counts.join(worst).join(tol)
    if "gqa" in df:  # how grouped K/V heads were fed to each variant
        out = out.join(
            df.groupby("variant")["gqa"].agg(lambda s: ", ".join(sorted({g for g in s if isinstance(g, str) and g})))
        )
    return out.reset_index()


def first_failures(df: pd.DataFrame, statuses=("oom",)) -> pd.DataFrame:
    """The shortest length at which each (configuration, variant) first hit one of ``statuses``, with the
    longest length it did run at and that run's peak memory (bytes, Q/K/V included)."""
    cols = ["config", "variant", "first_failure_len", "status", "longest_ok_len", "peak_at_longest_ok_bytes"]
    rows = []
    for (arch, d, var), g in df.groupby(["arch", "head_dim", "variant"]):
        bad = g[g["status"].isin(statuses)]
        if bad.empty:
            continue
        at = int(bad["q_len"].min())
        ran = g[g["status"].eq("ok") & (g["q_len"] < at)]
        rows.append(
            dict(
                config=config_label(arch, d),
                variant=var,
                first_failure_len=at,
                status=bad.loc[bad["q_len"].idxmin(), "status"],
                longest_ok_len=int(ran["q_len"].max()) if len(ran) else np.nan,
                peak_at_longest_ok_bytes=ran.loc[ran["q_len"].idxmax(), "peak_mem_incl_inputs_bytes"]
                if len(ran)
                else np.nan,
            )
        )
    return pd.DataFrame(rows, columns=cols)


def gqa_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape: time with K/V heads repeated / time with ``enable_gqa`` (both SDPA's default dispatch)."""
    ok = df[df["status"].eq("ok") & df["variant"].isin(["sdpa_default", "sdpa_repeat_kv"])]
    keys = ["arch", "heads", "kv_heads", "head_dim", "batch", "q_len", "kv_len"]
    t = ok.pivot_table(index=keys, columns="variant", values="median_ms")
    if not {"sdpa_default", "sdpa_repeat_kv"} <= set(t.columns):
        return pd.DataFrame(columns=keys + ["repeat_over_gqa"])
    t = t.dropna()
    t["repeat_over_gqa"] = t["sdpa_repeat_kv"] / t["sdpa_default"]
    return t.reset_index()


def best_point(df: pd.DataFrame, column: str = "pct_of_floor") -> pd.Series:
    """The measured point with the highest ``column`` (e.g. % of the roofline floor, GB/s)."""
    ok = df[df["status"].eq("ok")].dropna(subset=[column])
    if ok.empty:
        raise ValueError(f"no measured point has a {column}")
    return ok.loc[ok[column].idxmax()]


def gqa_summary(gqa: pd.DataFrame) -> pd.DataFrame:
    """``gqa_comparison`` per model and phase (prefill: many queries; decode: one): median and range of
    time(repeat K/V) / time(enable_gqa)."""
    g = gqa.assign(phase=np.where(gqa["q_len"].eq(1), "decode", "prefill"))
    return (
        g.groupby(["arch", "heads", "kv_heads", "phase"])["repeat_over_gqa"]
        .agg(shapes="size", median="median", min="min", max="max")
        .reset_index()
    )
