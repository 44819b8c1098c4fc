"""Capacity at an SLO, as Sarathi-Serve defines it: the highest request rate at which the p99
inter-token latency stays within the SLO.

From a rate sweep (``summary`` rows with ``rate``, ``itl_p99_ms``, ``cut``, ``failed``): a rate meets the SLO
when its p99 ITL ≤ the SLO and every request completed (a run whose requests were cut at the deadline is
past saturation whatever its ITL). The capacity is the highest measured rate below which every measured
rate meets it, so it is a lower bound that is only as fine as the sweep: 0 means "below the lowest rate
measured" (``capacity_req_s`` NaN: not a measured zero), and a capacity equal to the highest rate means "at least
that". ``first_miss_rate`` is the lowest rate that missed it (NaN where none did): with the capacity, the bracket.
The measuring path's capacity search (``sweep._search``) adds rates until both ends of the bracket are measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ["model", "scheduler", "budget"]


def meets_slo(summary: pd.DataFrame, slo_itl_ms: pd.Series | float) -> pd.Series:
    """Per row: p99 ITL within the SLO and nothing cut or failed."""
    return (summary["itl_p99_ms"] <= slo_itl_ms) & (summary["cut"].fillna(0) == 0) & (summary["failed"].fillna(0) == 0)


def capacity_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per model × scheduler × budget of the rate sweep: ``slo_itl_ms``, ``capacity_req_s``,
    ``lowest_rate``, ``highest_rate``, ``rates``, ``bound`` ('below lowest rate', 'within sweep',
    'at least highest rate')."""
    cols = KEYS + ["slo_itl_ms", "capacity_req_s", "first_miss_rate", "lowest_rate", "highest_rate", "rates", "bound"]
    if summary.empty or "status" not in summary:
        return pd.DataFrame(columns=cols)
    s = summary[(summary["status"] == "ok") & (summary["sweep"] == "rate")].copy()
    s = s[s["itl_p99_ms"].notna()] if "itl_p99_ms" in s else s.iloc[0:0]
    if s.empty:
        return pd.DataFrame(columns=cols)
    s["meets"] = meets_slo(s, s["slo_itl_ms"])
    rows = []
    for key, g in s.sort_values("rate").groupby(KEYS, sort=False):
        ok = g["meets"].to_numpy()
        first_bad = int(np.argmin(ok)) if not ok.all() else len(ok)
        cap = float(g["rate"].iloc[first_bad - 1]) if first_bad > 0 else float("nan")
        miss = float(g["rate"].iloc[first_bad]) if first_bad < len(ok) else float("nan")
        bound = (
            "below lowest rate"
            if first_bad == 0
            else "at least highest rate"
            if first_bad == len(ok)
            else "within sweep"
        )
        rows.append(
            dict(
                zip(KEYS, key, strict=True),
                slo_itl_ms=float(g["slo_itl_ms"].iloc[0]),
                capacity_req_s=cap,
                first_miss_rate=miss,
                lowest_rate=float(g["rate"].min()),
                highest_rate=float(g["rate"].max()),
                rates=len(g),
                bound=bound,
            )
        )
    return pd.DataFrame(rows, columns=cols)
