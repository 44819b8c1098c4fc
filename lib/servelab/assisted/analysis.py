"""From timed runs to the study's tables: speedups, cost ratios, per-pair summary, output match rates.

- speedup of a method on a prompt at output length k = (plain generate's ms to k tokens) / (the
  method's ms to k tokens), same target, same prompt; summarised over prompts by the median and
  quartiles;
- cost ratio c = the draft's plain decode ms/token ÷ the target's (medians of the per-token intervals
  of plain generate, i.e. HF eager decoding, as the assistant runs);
- the roofline floor of a decode token is the bytes of the weights over the copy bandwidth measured in
  this run (batch 1, short context: weights dominate).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def speedups(times: pd.DataFrame, baseline: str = "plain") -> pd.DataFrame:
    """Per prompt, method (≠ baseline), pair and length: baseline ms / method ms on the same target and prompt."""
    base = times[times["method"] == baseline][["prompt", "target", "length", "ms"]].rename(columns={"ms": "base_ms"})
    other = times[times["method"] != baseline]
    out = other.merge(base, on=["prompt", "target", "length"], how="inner")
    return out.assign(speedup=(out["base_ms"] / out["ms"]).astype(float), baseline=baseline)


def summarize_speedups(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Median and quartiles of the speedup over prompts, per method, pair and length."""
    keys = ["method", "pair", "target", "draft", "length"]
    cols = keys + ["speedup_median", "speedup_p25", "speedup_p75", "prompts"]
    d = per_prompt.dropna(subset=["speedup"])
    if d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(keys)["speedup"]
    out = g.agg(speedup_median="median", speedup_p25=lambda s: s.quantile(0.25),
                speedup_p75=lambda s: s.quantile(0.75), prompts="count").reset_index()
    return out.sort_values(["method", "pair", "length"], ignore_index=True)


def decode_costs(runs: pd.DataFrame, models: dict, roofline=None) -> pd.DataFrame:
    """Per model: plain-generate decode ms/token (median of per-token intervals over prompts), params,
    weight bytes and, with a roofline, the floor and % of it."""
    plain = runs[(runs["method"] == "plain") & (runs["status"] == "ok")]
    cols = ["model", "params", "layers", "weight_bytes", "ms_per_token", "ms_per_token_p25", "ms_per_token_p75",
            "prompts"] + (["floor_ms", "pct_of_floor"] if roofline is not None else [])
    rows = []
    for name, g in plain.groupby("target"):
        m = models[name]
        nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
        row = dict(model=name, params=sum(p.numel() for p in m.parameters()), layers=m.config.num_hidden_layers,
                   weight_bytes=nbytes, ms_per_token=float(g["ms_per_token_median"].median()),
                   ms_per_token_p25=float(g["ms_per_token_p25"].median()),
                   ms_per_token_p75=float(g["ms_per_token_p75"].median()), prompts=len(g))
        if roofline is not None:
            row["floor_ms"] = roofline.floor_ms(2.0 * row["params"], nbytes)
            row["pct_of_floor"] = 100.0 * row["floor_ms"] / row["ms_per_token"]
        rows.append(row)
    return pd.DataFrame(rows, columns=cols).sort_values("params", ascending=False, ignore_index=True)


def pair_summary(pairs, costs: pd.DataFrame, summary: pd.DataFrame, alpha: pd.DataFrame,
                 runs: pd.DataFrame, length: int) -> pd.DataFrame:
    """One row per pair: c (measured), params ratio, α, tokens per target step, speedup at ``length``."""
    cost = costs.set_index("model") if len(costs) else pd.DataFrame(columns=["ms_per_token", "params"])
    rows = []
    for p in pairs:
        row = dict(pair=p.name, draft=p.draft, target=p.target, cost_ratio=np.nan, params_ratio=np.nan)
        if p.draft in cost.index and p.target in cost.index:
            row["cost_ratio"] = cost.at[p.draft, "ms_per_token"] / cost.at[p.target, "ms_per_token"]
            row["params_ratio"] = cost.at[p.draft, "params"] / cost.at[p.target, "params"]
        a = alpha[alpha["pair"] == p.name]["alpha"] if len(alpha) else pd.Series(dtype=float)
        row["alpha"] = float(a.median()) if len(a) else np.nan
        r = runs[(runs["method"] == "assisted") & (runs["pair"] == p.name) & (runs["status"] == "ok")]
        row["tokens_per_step"] = float(r["tokens_per_step"].median()) if len(r) else np.nan
        s = summary[(summary["method"] == "assisted") & (summary["pair"] == p.name) & (summary["length"] == length)]
        for k in ("speedup_median", "speedup_p25", "speedup_p75", "prompts"):
            row[k] = float(s[k].iloc[0]) if len(s) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def match_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method and pair: share of runs whose output equals plain greedy, and the mean matching prefix."""
    r = runs[(runs["method"] != "plain") & (runs["status"] == "ok")].dropna(subset=["matches_plain"])
    if r.empty:
        return pd.DataFrame(columns=["method", "pair", "runs", "exact_match_rate", "matching_prefix_mean"])
    return (r.assign(exact=r["matches_plain"].astype(float))
             .groupby(["method", "pair"])
             .agg(runs=("exact", "size"), exact_match_rate=("exact", "mean"),
                  matching_prefix_mean=("matching_prefix", "mean"))
             .reset_index())


def own_acceptance(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the project's own decoder: drafted tokens accepted / proposed (its α at fixed γ), target
    forwards (rounds), and the KV rollback ("KV sync") time as a share of the run."""
    r = runs[(runs["method"] == "own") & (runs["status"] == "ok")]
    cols = ["pair", "runs", "accepted", "proposed", "alpha", "rounds", "rollback_ms", "rollback_share"]
    if r.empty or "proposed" not in r:
        return pd.DataFrame(columns=cols)
    g = r.groupby("pair").agg(runs=("prompt", "size"), accepted=("accepted", "sum"), proposed=("proposed", "sum"),
                              rounds=("rounds", "sum"), rollback_ms=("rollback_ms", "sum"), total_ms=("total_ms", "sum"))
    g["alpha"] = g["accepted"] / g["proposed"]
    g["rollback_share"] = g["rollback_ms"] / g["total_ms"]
    return g.reset_index()[cols]


def own_vs_engine(times: pd.DataFrame) -> pd.DataFrame:
    """The project's own speculative decoder against the same engine running the target alone (``own_plain``),
    summarised like :func:`summarize_speedups` (only lengths where the target-alone run has a time)."""
    own = times[times["method"].isin(["own", "own_plain"])].replace({"method": {"own_plain": "plain"}})
    return summarize_speedups(speedups(own))
