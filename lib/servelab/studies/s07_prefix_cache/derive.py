"""Study 7's derived tables, computed at report time from the raw sweeps: speedups (F7.1, F7.2) and the batch size
from which sharing a prefix pays (F7.3). Pure pandas: nothing here touches the engine."""

from __future__ import annotations

import numpy as np
import pandas as pd


def speedups(df: pd.DataFrame, key: str | list[str] = "prefix_tokens") -> pd.DataFrame:
    """Uncached over cached median time per ``key``, with a spread from the quartiles
    (``speedup_lo`` = uncached p25 / cached p75, ``speedup_hi`` = uncached p75 / cached p25)."""
    keys = [key] if isinstance(key, str) else list(key)
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=keys + ["uncached_ms", "cached_ms", "speedup", "speedup_lo", "speedup_hi"])
    u = ok[ok["mode"] == "uncached"].set_index(keys)
    c = ok[ok["mode"] == "cached"].set_index(keys)
    both = u.index.intersection(c.index)
    out = pd.DataFrame({"uncached_ms": u.loc[both, "median_ms"], "cached_ms": c.loc[both, "median_ms"]})
    out["speedup"] = out["uncached_ms"] / out["cached_ms"]
    out["speedup_lo"] = u.loc[both, "p25_ms"] / c.loc[both, "p75_ms"]
    out["speedup_hi"] = u.loc[both, "p75_ms"] / c.loc[both, "p25_ms"]
    return out.reset_index()


def turn_speedups(mt: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, turn): uncached / cached median time (``speedup``, with a quartile range), beside the prompt,
    history and output lengths."""
    out = speedups(mt, ["metric", "turn"])
    info = mt.drop_duplicates(["metric", "turn"]).set_index(["metric", "turn"])[
        ["prompt_tokens", "history_tokens", "output_tokens"]
    ]
    return out.join(info, on=["metric", "turn"])


BREAKEVEN_COLUMNS = ["prefix_tokens", "breakeven_n", "max_n", "ratio_at_max_n", "ratios"]


def sharing_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per prefix length and n: the time with every request prefilling the prefix over the time sharing it
    (``ratio``, independent / shared median times), where both ran."""
    cols = ["prefix_tokens", "n", "ratio"]
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    t = ok.pivot_table(index=["prefix_tokens", "n"], columns="sharing", values="median_ms")
    if not {"shared", "independent"} <= set(t.columns):
        return pd.DataFrame(columns=cols)
    t = t.dropna().reset_index()
    t["ratio"] = t["independent"] / t["shared"]
    return t[cols]


def breakeven_of(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per prefix length, from ``sharing_ratios`` (one repeat's, or each point's median over repeats): the ratio at
    each n, and ``breakeven_n``, the smallest n ≥ 2 from which sharing is at least as fast at every larger n measured
    (NaN if it never is)."""
    rows = []
    for p, g in ratios.groupby("prefix_tokens"):
        g = g.sort_values("n")
        cand = g[g["n"] >= 2]
        be = np.nan
        for n in cand["n"]:
            if (cand.loc[cand["n"] >= n, "ratio"] >= 1.0).all():
                be = n
                break
        rows.append(
            {
                "prefix_tokens": p,
                "breakeven_n": be,
                "max_n": int(g["n"].max()),
                "ratio_at_max_n": float(g["ratio"].iloc[-1]),
                "ratios": ", ".join(f"n={int(n)}: {r:.2f}×" for n, r in zip(g["n"], g["ratio"], strict=True)),
            }
        )
    return pd.DataFrame(rows, columns=BREAKEVEN_COLUMNS)


def breakeven(df: pd.DataFrame) -> pd.DataFrame:
    """Per prefix length: the time ratio independent / shared at each n, and ``breakeven_n``, the smallest n ≥ 2
    from which sharing is at least as fast at every larger n measured (NaN if it never is)."""
    return breakeven_of(sharing_ratios(df))
