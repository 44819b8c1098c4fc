"""Straight-line cost models fitted to measured times: a fixed cost plus a cost per unit (token, request).

A prefix cache saves only the part of a prefill that grows with the cached tokens; the fixed part (launching
the step's kernels, scheduling, sampling) is paid either way. Fitting ``time = fixed + slope × x`` to the
sweeps says how large each part is, and so how much caching can save at a given length.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats


def linear_cost(df: pd.DataFrame, x: str, y: str = "median_ms") -> dict:
    """Least-squares ``y = fixed + slope × x`` over the rows with ``status == "ok"``: ``fixed`` (y's unit),
    ``slope`` (y's unit per unit of x), ``r2``, ``points``; NaN with fewer than two distinct x."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    if ok.empty or ok[x].nunique() < 2:
        return {"fixed": np.nan, "slope": np.nan, "r2": np.nan, "points": int(len(ok))}
    fit = stats.linregress(ok[x].astype(float), ok[y].astype(float))
    return {
        "fixed": float(fit.intercept),
        "slope": float(fit.slope),
        "r2": float(fit.rvalue**2),
        "points": int(len(ok)),
    }


def prefill_costs(f71: pd.DataFrame) -> pd.DataFrame:
    """F7.1's two lines: uncached TTFT against the tokens prefilled (``slope`` in ms/token), cached TTFT against
    the cached prefix length (``slope``: what each cached token still costs, read back from the pool)."""
    rows = []
    for mode, x in (("uncached", "computed_tokens"), ("cached", "prefix_tokens")):
        d = f71[f71["mode"] == mode]
        rows.append({"mode": mode, "x": x, **linear_cost(d, x)})
    return pd.DataFrame(rows)


def sharing_costs(f73: pd.DataFrame) -> pd.DataFrame:
    """F7.3: per prefix length and sharing, time against n (``slope``: ms per additional request)."""
    rows = []
    for (p, sharing), d in f73.groupby(["prefix_tokens", "sharing"]):
        rows.append({"prefix_tokens": p, "sharing": sharing, **linear_cost(d, "n")})
    return pd.DataFrame(rows)
