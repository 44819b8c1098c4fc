"""Mean TTFT over the same requests for every policy setting at one rate, a request with no first token by the
deadline counted at the deadline (F1.3's statistic since 2026-12-07).

A point's plain ``mean_ttft_ms`` averages its *completed* requests. Past capacity that rewards the policy that
cuts most: on the H200 (94c0bf13c028) FCFS on the 8B shape cut 83% of its requests at the top rate and
ChunkedPrefill@512 on the 0.5B shape cut 61% at 62 req/s, and the requests a policy never started are exactly the
ones that waited longest. So F1.3 compares settings on one set of requests with right-censoring made explicit:

- the requests are those every setting at the rate was offered (the settings replay one trace, so a request id is
  the same arrival in every part; a point that ran a longer second attempt offered more, and only the common prefix
  is compared);
- the horizon is the earliest deadline among them, so no setting is credited for waiting longer;
- a request's value is its TTFT (first token − send) if its first token came by the horizon, else the horizon −
  its send time (its arrival where it was never sent): it waited at least that long.

The mean of these is the restricted mean TTFT of survival analysis: exact where nothing was cut, a lower bound on
the true mean where something was, and the same bound for every setting, so an ordering by it is fair. Each point
also gets the number of common requests and how many of them were censored.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["common_ttft_ms", "common_requests", "common_censored"]


def _request_ids(g: pd.DataFrame) -> set:
    return set(g["request_id"].tolist())


def _restricted(g: pd.DataFrame, ids: set, horizon_s: float) -> tuple[float, int]:
    """The mean of each common request's TTFT capped at the horizon (ms) and how many were capped. A request sent
    after the horizon (client lag past the earliest deadline) counts 0: by the horizon it had waited nothing."""
    g = g[g["request_id"].isin(ids)]
    origin = g["sent_s"].to_numpy(dtype=float)
    origin = np.where(np.isnan(origin), g["arrival_s"].to_numpy(dtype=float), origin)
    first = g["first_token_s"].to_numpy(dtype=float)
    seen = ~np.isnan(first) & (first <= horizon_s)
    waited = np.where(seen, first - origin, np.maximum(horizon_s - origin, 0.0)) * 1e3
    return (float(waited.mean()) if len(waited) else float("nan")), int((~seen).sum())


def with_common_ttft(summary: pd.DataFrame, offered: dict) -> pd.DataFrame:
    """``summary`` (one row per point, ``summary.summary_table``'s) with ``COLUMNS`` added: per (repeat, model,
    sweep, rate fraction), over the settings whose point ran (status ok, requests in ``offered``). ``offered`` maps
    a row's index to its offered requests (``summary.request_table`` rows with ``first_token_s``); a row missing
    from it, or a point without a deadline, gets NaN."""
    out = summary.copy()
    for c in COLUMNS:
        out[c] = np.nan
    if out.empty or "deadline_s" not in out:
        return out
    group = [c for c in ("repeat", "model", "sweep", "rate_fraction") if c in out.columns]
    for _, g in out.groupby(group, sort=False, dropna=False):
        rows = [
            i for i in g.index if i in offered and "first_token_s" in offered[i] and pd.notna(out.at[i, "deadline_s"])
        ]
        if not rows:
            continue
        ids = set.intersection(*(_request_ids(offered[i]) for i in rows))
        horizon = float(min(out.at[i, "deadline_s"] for i in rows))
        for i in rows:
            mean, censored = _restricted(offered[i], ids, horizon)
            out.loc[i, COLUMNS] = [mean, len(ids), censored]
    return out
