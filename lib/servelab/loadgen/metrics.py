"""Serving metrics from per-request records, as vLLM's benchmark defines them.

A run produces one **record** per request (a row of a DataFrame, see ``RECORD_COLUMNS``); every time is in
seconds from the run's start on one clock (``time.perf_counter``):

- ``arrival_s``: when the trace says the request arrives (the intended send time);
- ``sent_s``: when the client actually sent it; ``first_token_s`` / ``finish_s``: its first and last token;
- ``token_times_s``: the arrival of every streamed token (a list of floats);
- ``output_tokens``: tokens received; ``ok`` / ``error``: whether it completed, and why not.

The real load generator and the simulator both emit this schema, so their tables compare column for column.

Definitions (vLLM ``benchmarks/benchmark_serving.py``):

- TTFT = first token − send time; E2E = last token − send time;
- TPOT = (E2E − TTFT) / (output tokens − 1), for requests with more than one output token;
- ITL = the gaps between successive tokens of a request, pooled over all requests for the percentiles;
- max ITL is the worst decode stall of the run;
- throughput = output tokens / duration; request throughput = completed requests / duration;
- goodput = requests that meet every SLO given (TTFT, TPOT) / duration.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from servelab.errors import ParameterError

RECORD_COLUMNS = [
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "sent_s",
    "first_token_s",
    "finish_s",
    "token_times_s",
    "ok",
    "error",
]
PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")
SUMMARY_KEYS = [f"{m}_p{p}_ms" for m in LATENCIES for p in PERCENTILES] + [
    "max_itl_ms",
    "throughput_tok_s",
    "request_throughput",
    "goodput_req_s",
    "completed",
    "failed",
]


def empty_records() -> pd.DataFrame:
    """A records frame with the schema and no rows."""
    return pd.DataFrame(
        {c: pd.Series(dtype=object if c in ("token_times_s", "error") else float) for c in RECORD_COLUMNS}
    )


def check_records(records: pd.DataFrame) -> pd.DataFrame:
    """Raise ``ParameterError`` if columns are missing; return the frame with ``token_times_s`` as lists
    (a CSV round trip stores them as JSON strings) and ``ok`` as bool."""
    if not isinstance(records, pd.DataFrame):
        raise ParameterError(f"records must be a pandas DataFrame, got {type(records).__name__}")
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ParameterError(f"records lack columns {missing}; the schema is {RECORD_COLUMNS}")
    out = records.copy()
    out["token_times_s"] = [_as_list(v) for v in out["token_times_s"]]
    out["ok"] = out["ok"].astype(bool)
    return out


def _as_list(v) -> list[float]:
    if isinstance(v, str):
        return [float(x) for x in json.loads(v)] if v.strip() else []
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return []
    return [float(x) for x in v]


def records_for_csv(records: pd.DataFrame) -> pd.DataFrame:
    """The records with ``token_times_s`` as a JSON string (one CSV cell), times rounded to 1 µs."""
    out = records.copy()
    out["token_times_s"] = [json.dumps([round(t, 6) for t in _as_list(v)]) for v in out["token_times_s"]]
    return out


def request_metrics(records: pd.DataFrame) -> pd.DataFrame:
    """Per request: ``ttft_ms``, ``tpot_ms`` (NaN with fewer than two tokens), ``e2e_ms``, ``itl`` (list of
    gaps, ms), ``max_itl_ms`` (NaN with fewer than two tokens), ``queue_lag_ms`` (sent − intended arrival:
    the client's own lateness, which should stay near zero), beside ``request_id``, ``ok``,
    ``prompt_tokens``, ``output_tokens``. Failed requests keep NaN latencies."""
    r = check_records(records)
    rows = []
    for rec in r.itertuples(index=False):
        times = rec.token_times_s
        ok = bool(rec.ok)
        ttft = (rec.first_token_s - rec.sent_s) * 1e3 if ok else np.nan
        e2e = (rec.finish_s - rec.sent_s) * 1e3 if ok else np.nan
        itl = list(np.diff(times) * 1e3) if ok and len(times) > 1 else []
        n_out = int(rec.output_tokens) if ok else 0
        tpot = (e2e - ttft) / (n_out - 1) if ok and n_out > 1 else np.nan
        rows.append(
            {
                "request_id": rec.request_id,
                "ok": ok,
                "prompt_tokens": rec.prompt_tokens,
                "output_tokens": rec.output_tokens,
                "ttft_ms": ttft,
                "tpot_ms": tpot,
                "e2e_ms": e2e,
                "max_itl_ms": max(itl) if itl else np.nan,
                "itl": itl,
                "queue_lag_ms": (rec.sent_s - rec.arrival_s) * 1e3,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
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
        ],
    )


def _pct(values, p: float) -> float:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, p)) if v.size else float("nan")


def summarize(
    records: pd.DataFrame,
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    duration_s: float | None = None,
) -> dict:
    """The run's summary (keys ``SUMMARY_KEYS``): p50/p90/p99 of TTFT, TPOT, ITL and E2E in ms, max ITL
    (ms), output-token throughput (tokens/s), request throughput and goodput (requests/s), completed and
    failed counts.

    ``duration_s`` defaults to the span from the first send to the last finish. Goodput counts completed
    requests whose TTFT ≤ ``slo_ttft_ms`` and TPOT ≤ ``slo_tpot_ms`` (an SLO left at None is not checked;
    with none given, goodput equals request throughput; a single-token request has no TPOT and meets a
    TPOT SLO).
    """
    for name, v in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms), ("duration_s", duration_s)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise ParameterError(f"{name} must be a positive number or None, got {v!r}")
    m = request_metrics(records)
    done = m.loc[m["ok"].astype(bool)]
    r = check_records(records)
    if duration_s is None:
        okr = r.loc[r["ok"]]
        duration_s = float(okr["finish_s"].max() - r["sent_s"].min()) if len(okr) else float("nan")
    itl = [g for gaps in done["itl"] for g in gaps]
    out = {}
    for name, vals in (("ttft", done["ttft_ms"]), ("tpot", done["tpot_ms"]), ("itl", itl), ("e2e", done["e2e_ms"])):
        for p in PERCENTILES:
            out[f"{name}_p{p}_ms"] = _pct(vals, p)
    out["max_itl_ms"] = float(max(itl)) if itl else float("nan")
    good = np.ones(len(done), dtype=bool)
    if slo_ttft_ms is not None:
        good &= (done["ttft_ms"] <= slo_ttft_ms).to_numpy()
    if slo_tpot_ms is not None:
        good &= (done["tpot_ms"].fillna(0.0) <= slo_tpot_ms).to_numpy()
    span = duration_s if duration_s and duration_s > 0 else float("nan")
    out["throughput_tok_s"] = float(done["output_tokens"].sum()) / span
    out["request_throughput"] = len(done) / span
    out["goodput_req_s"] = int(good.sum()) / span
    out["completed"] = int(len(done))
    out["failed"] = int(len(m) - len(done))
    return out
