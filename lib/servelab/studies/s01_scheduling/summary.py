"""Study 1's per-point summary from one repeat's raw tables (its reporting path's first step, apart from the page).

``points`` (or the legacy run's ``summary``, its statistics ignored) says which load points ran; ``requests``
holds every request's token times. From them each point gets vLLM's latency percentiles, the worst-stall
statistic (the p99 of the per-request maximum ITL, with its bootstrap interval), delivered throughput and cut
requests. ``report`` builds the page on it; the old rules (``common.rules``) read it too, which is why it is a
module of its own: it imports neither the verdicts nor the rules.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.loadgen.metrics import SUMMARY_KEYS, run_span_s, summarize_metrics
from servelab.loadgen.run import DEADLINE_ERROR
from servelab.studies.common.runs import RunSet
from servelab.studies.s01_scheduling.common_ttft import with_common_ttft
from servelab.studies.s01_scheduling.stall import p99_of_max_itl

KEYS = ["model", "scheduler", "budget", "rate_fraction", "sweep"]  # one load point
RAW_POINT = [
    "rate",
    "status",
    "attempts",
    "min_requests",
    "window_s",
    "deadline_s",
    "duration_s",
    "slo_itl_ms",
    "warmup_ms",
]


def points_table(rep: RunSet) -> pd.DataFrame:
    """The load points of one repeat (or of several): ``points.csv``, or the legacy run's ``summary.csv`` reduced
    to its raw columns (its statistics are recomputed from its requests, never read)."""
    pts = rep.table("points")
    if pts.empty:
        pts = rep.table("summary")
    if pts.empty:
        return pts
    keep = ["repeat", "part", *KEYS, *RAW_POINT]
    pts = pts.reindex(columns=[c for c in keep if c in pts.columns or c in RAW_POINT])
    pts["attempts"] = pts["attempts"].fillna(1)
    return pts


def _is_cut(error: pd.Series) -> pd.Series:
    return error.fillna("").astype(str) == DEADLINE_ERROR


def _token_times(values) -> tuple[np.ndarray, np.ndarray]:
    """Every request's token times (lists, or their CSV text: JSON lists) flattened in request order, and each
    request's count. The CSV text is parsed in one pass, each number by ``float`` as ``json`` would."""
    vals = list(values)
    counts = np.zeros(len(vals), dtype=np.int64)
    parts: list[str] = []
    arrays: list[np.ndarray] = []
    for i, v in enumerate(vals):
        if isinstance(v, str):
            inner = v.strip()[1:-1].strip()
            if inner:
                counts[i] = inner.count(",") + 1
                parts.append(inner)
        elif v is not None and not (isinstance(v, float) and v != v):
            a = np.asarray(v, dtype=float)
            counts[i] = a.size
            if parts:  # mixed text and lists: keep the order
                arrays.append(np.fromiter(map(float, ",".join(parts).split(",")), float))
                parts = []
            arrays.append(a)
    if parts:
        arrays.append(np.fromiter(map(float, ",".join(parts).split(",")), float))
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return flat, counts


METRIC_COLUMNS = [
    "request_id",
    "ok",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "max_itl_ms",
    "itl",
    "queue_lag_ms",
    "arrival_s",
]


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """``loadgen.metrics.request_metrics`` of every request at once (the same columns and numbers, vectorised), beside
    each request's point columns (``repeat``, the keys, ``rate``), its ``cut`` flag, its token count and span
    (``tokens``, ``last_token_s``), and ``sent_s``/``first_token_s``/``finish_s``: one parse of ``token_times_s``
    serves the summaries, the verdicts and the figures."""
    if requests.empty:
        return pd.DataFrame(columns=METRIC_COLUMNS)
    n = len(requests)
    flat, counts = _token_times(requests["token_times_s"])
    ok = requests["ok"].astype(bool).to_numpy()
    sent = requests["sent_s"].to_numpy(dtype=float)
    first = requests["first_token_s"].to_numpy(dtype=float)
    finish = requests["finish_s"].to_numpy(dtype=float)
    out_tok = requests["output_tokens"].to_numpy(dtype=float)
    ttft = np.where(ok, (first - sent) * 1e3, np.nan)
    e2e = np.where(ok, (finish - sent) * 1e3, np.nan)
    n_out = np.where(ok, np.nan_to_num(out_tok), 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (n_out > 1), (e2e - ttft) / (n_out - 1), np.nan)
    owner = np.repeat(np.arange(n), counts)  # the request of each token
    same = owner[:-1] == owner[1:]
    gap_owner = owner[:-1][same]
    gaps = (np.diff(flat) * 1e3)[same]
    keep = ok[gap_owner]  # a failed request keeps no gaps, as request_metrics
    gaps, gap_owner = gaps[keep], gap_owner[keep]
    n_gaps = np.bincount(gap_owner, minlength=n)
    max_itl = np.full(n, np.nan)
    has = n_gaps > 0
    if has.any():
        starts = np.concatenate([[0], np.cumsum(n_gaps)[:-1]])
        max_itl[has] = np.maximum.reduceat(gaps, starts[has])
    last = np.full(n, np.nan)
    nonempty = counts > 0
    if nonempty.any():
        ends = np.cumsum(counts) - 1
        last[nonempty] = flat[ends[nonempty]]
    point_cols = [c for c in ("repeat", "part", *KEYS, "rate") if c in requests.columns]
    m = requests[point_cols].reset_index(drop=True)
    m = m.assign(
        request_id=requests["request_id"].to_numpy(),
        ok=ok,
        prompt_tokens=requests["prompt_tokens"].to_numpy(),
        output_tokens=requests["output_tokens"].to_numpy(),
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=e2e,
        max_itl_ms=max_itl,
        itl=_objects(np.split(gaps, np.cumsum(n_gaps)[:-1])),
        queue_lag_ms=(sent - requests["arrival_s"].to_numpy(dtype=float)) * 1e3,
        arrival_s=requests["arrival_s"].to_numpy(dtype=float),
        cut=_is_cut(requests["error"]).to_numpy() if "error" in requests else False,
        tokens=counts,
        last_token_s=last,
        sent_s=sent,
        first_token_s=first,
        finish_s=finish,
    )
    return m


def _objects(items: list) -> np.ndarray:
    """A 1-d object array of ``items`` (arrays of equal length stay one per cell)."""
    out = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        out[i] = x
    return out


def point_summary(m: pd.DataFrame, slo_itl_ms: float | None, seed: int = 0) -> dict:
    """One point's statistics from its rows of ``request_table`` (or from its raw request records): what
    ``loadgen.metrics.summarize`` gives, the worst-stall statistic, mean TTFT, delivered throughput, cut requests."""
    if "token_times_s" in m.columns:
        m = request_table(m)
    slo = slo_itl_ms if slo_itl_ms is not None and slo_itl_ms == slo_itl_ms and slo_itl_ms > 0 else None
    okm = m["ok"].to_numpy(dtype=bool)
    ok = m[okm]
    itl = np.concatenate(list(ok["itl"])) if len(ok) else np.zeros(0)
    span_run = run_span_s(m["sent_s"], m["finish_s"], okm)
    s = summarize_metrics(m, itl, duration_s=span_run, slo_tpot_ms=slo)
    tokens = int(m["tokens"].sum())
    span = float(m["last_token_s"].max() - m["sent_s"].min()) if tokens else float("nan")
    return {
        **{k: s[k] for k in SUMMARY_KEYS},
        "requests": len(m),
        "cut": int(m["cut"].sum()),
        **p99_of_max_itl(ok["max_itl_ms"], seed=seed),
        "mean_ttft_ms": float(ok["ttft_ms"].mean()) if len(ok) else float("nan"),
        "delivered_tok_s": tokens / span if tokens and span > 0 else float("nan"),
        "max_lag_ms": float(m["queue_lag_ms"].max()) if len(m) else float("nan"),
    }


def offered(g: pd.DataFrame, deadline_s) -> tuple[pd.DataFrame, int]:
    """A point's requests that arrived by its run's deadline, and how many of its trace arrived after it.

    A point replays the first ``rate × window`` arrivals of its trace, but Poisson arrivals of that many requests
    may run past the window, and past the deadline (the window plus the drain): on the H200, 8 of one repeat's
    Llama requests at 3.1 req/s arrived after it. The load generator never sends such a request within the run; it
    records it as cut at the deadline with no token, and counted so, it made the point miss the SLO (``capacity``:
    nothing cut) at rates where every request that was sent met it. Such requests were never offered: they are
    left out of the point, and counted in its ``not_offered``."""
    if "arrival_s" not in g or deadline_s is None or pd.isna(deadline_s):
        return g, 0
    late = g["arrival_s"].to_numpy(dtype=float) > float(deadline_s)
    return g[~late], int(late.sum())


def summary_table(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Every point of ``points`` with its statistics recomputed from ``requests`` (raw records, or their
    ``request_table``; a point none of whose requests are there keeps its raw columns, statistics NaN), over the
    requests that arrived by its deadline (``offered``; ``not_offered`` counts the others); ``shortfall``: requests
    short of ``min_requests``; ``common_ttft.COLUMNS``: the mean TTFT every setting at a rate is compared on."""
    if points.empty:
        return points
    m = request_table(requests) if "token_times_s" in requests.columns else requests
    group = [c for c in ("repeat", *KEYS) if c in points.columns and c in m.columns]
    by = {k: g for k, g in m.groupby(group, sort=False)} if not m.empty else {}
    rows, sent = [], {}
    for i, p in enumerate(points.to_dict("records")):
        g = by.get(tuple(p[c] for c in group))
        if p["status"] == "ok" and g is not None and len(g):
            g, p["not_offered"] = offered(g, p.get("deadline_s"))
            p.update(point_summary(g, p.get("slo_itl_ms")))
            sent[i] = g
        rows.append(p)
    out = pd.DataFrame(rows)
    if "completed" in out and "min_requests" in out:
        out["shortfall"] = (out["min_requests"] - out["completed"]).clip(lower=0)
    return with_common_ttft(out, sent)


def repeat_summary(rep: RunSet) -> pd.DataFrame:
    return summary_table(points_table(rep), rep.table("requests"))
