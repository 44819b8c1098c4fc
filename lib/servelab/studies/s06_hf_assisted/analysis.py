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

from servelab.studies.s06_hf_assisted.runs import DONE, METHODS


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
    out = g.agg(
        speedup_median="median",
        speedup_p25=lambda s: s.quantile(0.25),
        speedup_p75=lambda s: s.quantile(0.75),
        prompts="count",
    ).reset_index()
    return out.sort_values(["method", "pair", "length"], ignore_index=True)


def model_sizes(models: dict) -> pd.DataFrame:
    """One row per HF model: parameters, layers, weight bytes (what ``decode_costs`` needs beside the runs)."""
    return pd.DataFrame(
        [
            dict(
                model=name,
                params=sum(p.numel() for p in m.parameters()),
                layers=m.config.num_hidden_layers,
                weight_bytes=sum(p.numel() * p.element_size() for p in m.parameters()),
            )
            for name, m in models.items()
        ],
        columns=["model", "params", "layers", "weight_bytes"],
    )


def decode_costs(runs: pd.DataFrame, models, roofline=None) -> pd.DataFrame:
    """Per model: plain-generate decode ms/token (median of per-token intervals over prompts), params,
    layers, weight bytes and, with a roofline, the floor and % of it. ``models``: the sizes table (``model``,
    ``params``, ``layers``, ``weight_bytes``; the measuring path's ``models.csv``) or {name: HF model}."""
    sizes = model_sizes(models) if isinstance(models, dict) else models
    cols = [
        "model",
        "params",
        "layers",
        "weight_bytes",
        "ms_per_token",
        "ms_per_token_p25",
        "ms_per_token_p75",
        "prompts",
    ] + (["floor_ms", "pct_of_floor"] if roofline is not None else [])
    if runs.empty or sizes is None or sizes.empty:
        return pd.DataFrame(columns=cols)
    plain = runs[(runs["method"] == "plain") & runs["status"].isin(DONE)]
    size = sizes.drop_duplicates("model").set_index("model")
    rows = []
    for name, g in plain.groupby("target"):
        if name not in size.index:
            continue
        s = size.loc[name]
        row = dict(
            model=name,
            params=int(s["params"]),
            layers=int(s["layers"]),
            weight_bytes=int(s["weight_bytes"]),
            ms_per_token=float(g["ms_per_token_median"].median()),
            ms_per_token_p25=float(g["ms_per_token_p25"].median()),
            ms_per_token_p75=float(g["ms_per_token_p75"].median()),
            prompts=len(g),
        )
        if roofline is not None:
            row["floor_ms"] = roofline.floor_ms(2.0 * row["params"], row["weight_bytes"])
            row["pct_of_floor"] = 100.0 * row["floor_ms"] / row["ms_per_token"]
        rows.append(row)
    return pd.DataFrame(rows, columns=cols).sort_values("params", ascending=False, ignore_index=True)


def pair_summary(
    pairs, costs: pd.DataFrame, summary: pd.DataFrame, alpha: pd.DataFrame, runs: pd.DataFrame, lengths: int | list[int]
) -> pd.DataFrame:
    """One row per pair and output length: c (measured), params ratio, α, tokens per target step, and the
    assisted speedup at that length (NaN where the pair did not run that long)."""
    cost = costs.set_index("model") if len(costs) else pd.DataFrame(columns=["ms_per_token", "params"])
    rows = []
    for p in pairs:
        row = dict(pair=p.name, draft=p.draft, target=p.target, cost_ratio=np.nan, params_ratio=np.nan)
        if p.draft in cost.index and p.target in cost.index:
            row["cost_ratio"] = cost.at[p.draft, "ms_per_token"] / cost.at[p.target, "ms_per_token"]
            row["params_ratio"] = cost.at[p.draft, "params"] / cost.at[p.target, "params"]
        a = alpha[alpha["pair"] == p.name]["alpha"] if len(alpha) else pd.Series(dtype=float)
        row["alpha"] = float(a.median()) if len(a) else np.nan
        r = runs[(runs["method"] == "assisted") & (runs["pair"] == p.name) & runs["status"].isin(DONE)]
        row["tokens_per_step"] = float(r["tokens_per_step"].median()) if len(r) else np.nan
        for length in [lengths] if isinstance(lengths, int) else lengths:
            s = summary[(summary["method"] == "assisted") & (summary["pair"] == p.name) & (summary["length"] == length)]
            rows.append(
                dict(
                    row,
                    length=length,
                    **{
                        k: float(s[k].iloc[0]) if len(s) else np.nan
                        for k in ("speedup_median", "speedup_p25", "speedup_p75", "prompts")
                    },
                )
            )
    return pd.DataFrame(rows)


def coverage(runs: pd.DataFrame, times: pd.DataFrame, lengths: list[int]) -> pd.DataFrame:
    """Which output lengths were measured for which planned method and pair: prompts with a time, per
    length (0: not measured at that length)."""
    cols = ["method", "pair"] + list(lengths)
    if runs.empty:
        return pd.DataFrame(columns=cols)
    planned = runs[["method", "pair"]].drop_duplicates()
    counts = (
        times.groupby(["method", "pair", "length"])["prompt"].nunique().unstack("length")
        if len(times)
        else pd.DataFrame()
    )
    t = planned.merge(counts.reset_index(), on=["method", "pair"], how="left") if len(counts) else planned
    t = t.reindex(columns=cols).fillna({k: 0 for k in lengths})
    t[list(lengths)] = t[list(lengths)].astype(int)
    t["method"] = pd.Categorical(t["method"], METHODS, ordered=True)
    t = t.sort_values(["method", "pair"], ignore_index=True)
    return t.assign(method=t["method"].astype(str))[cols]


def coverage_text(cov: pd.DataFrame, runs: pd.DataFrame, length: int, labels: dict | None = None) -> str:
    """Markdown: which methods and pairs were measured at ``length`` tokens, and why the others planned
    that long were not (the reason recorded in the runs table)."""
    labels = labels or {}
    if cov.empty or length not in cov:
        return f"Nothing was measured at {length} tokens."
    ran = cov[cov[length] > 0]
    by_method = [f"{labels.get(m, m)} ({', '.join(g['pair'])})" for m, g in ran.groupby("method", sort=False)]
    long = runs[runs["new_tokens"] >= length]
    missing = []
    for r in cov[cov[length] == 0].itertuples():
        planned = long[(long["method"] == r.method) & (long["pair"] == r.pair)]
        if len(planned):
            why = planned.iloc[0]
            missing.append(f"{labels.get(r.method, r.method)} {r.pair} ({why['status']}: {why['error']})")
    text = f"**Measured at {length} tokens:** " + ("; ".join(by_method) if by_method else "nothing") + "."
    if missing:
        text += f"\n\n**Planned at {length} tokens but not measured:** " + "; ".join(missing) + "."
    return text


def not_run(runs: pd.DataFrame) -> pd.DataFrame:
    """The planned runs that made no tokens or stopped early, with why (skipped for the budget or a
    missing baseline, failed, cut at the budget)."""
    cols = ["prompt", "pass_kind", "method", "pair", "new_tokens", "status", "error"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    return runs[runs["status"] != "ok"][cols].reset_index(drop=True)


def longest_measured(summary: pd.DataFrame, method: str = "assisted") -> dict[int, list[str]]:
    """{length: pairs of ``method`` with a speedup at that length}, longest first."""
    d = summary[summary["method"] == method].dropna(subset=["speedup_median"]) if len(summary) else summary
    if d.empty:
        return {}
    return {int(k): sorted(g["pair"]) for k, g in sorted(d.groupby("length"), key=lambda kv: -kv[0])}


def match_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method and pair: share of runs whose output equals plain greedy, and the mean matching prefix."""
    r = runs[(runs["method"] != "plain") & runs["status"].isin(DONE)].dropna(subset=["matches_plain"])
    if r.empty:
        return pd.DataFrame(columns=["method", "pair", "runs", "exact_match_rate", "matching_prefix_mean"])
    return (
        r.assign(exact=r["matches_plain"].astype(float))
        .groupby(["method", "pair"])
        .agg(
            runs=("exact", "size"), exact_match_rate=("exact", "mean"), matching_prefix_mean=("matching_prefix", "mean")
        )
        .reset_index()
    )


def own_acceptance(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the project's own decoder: drafted tokens accepted / proposed (its α at fixed γ), target
    forwards (rounds), and the KV rollback ("KV sync") time as a share of the run."""
    r = runs[(runs["method"] == "own") & runs["status"].isin(DONE)]
    cols = ["pair", "runs", "accepted", "proposed", "alpha", "rounds", "rollback_ms", "rollback_share"]
    if r.empty or "proposed" not in r:
        return pd.DataFrame(columns=cols)
    g = r.groupby("pair").agg(
        runs=("prompt", "size"),
        accepted=("accepted", "sum"),
        proposed=("proposed", "sum"),
        rounds=("rounds", "sum"),
        # NaN where the decoder has no rollback phase of its own (the engine's mode gives rejected KV back inside
        # its step, ``own_engine``): a plain sum would print those runs' 0 ms as measured
        rollback_ms=("rollback_ms", lambda x: x.sum(min_count=1)),
        total_ms=("total_ms", "sum"),
    )
    g["alpha"] = g["accepted"] / g["proposed"]
    g["rollback_share"] = g["rollback_ms"] / g["total_ms"]
    return g.reset_index()[cols]


def own_vs_engine(times: pd.DataFrame) -> pd.DataFrame:
    """The project's own speculative decoder against the same engine running the target alone (``own_plain``),
    summarised like :func:`summarize_speedups` (only lengths where the target-alone run has a time)."""
    own = times[times["method"].isin(["own", "own_plain"])].replace({"method": {"own_plain": "plain"}})
    return summarize_speedups(speedups(own))
