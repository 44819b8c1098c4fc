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
- goodput = requests that meet every SLO given (TTFT, TPOT) / duration;
- total token throughput = (input + output tokens of the completed requests) / duration.

``summarize_metrics`` computes every summary number once, for the load generator (``summarize``,
``benchmark_summary``) and for the simulator (``servelab.sim.simulator.SimRun.summary``), whose long runs keep
no per-token times and pass compact per-request metrics instead.
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
# beyond SUMMARY_KEYS (which the studies' tables hold), what vLLM's benchmark_serving prints
BENCHMARK_KEYS = (
    SUMMARY_KEYS
    + [f"{m}_mean_ms" for m in LATENCIES]
    + ["duration_s", "total_input_tokens", "total_output_tokens", "total_token_throughput_tok_s"]
)


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


def _mean(values) -> float:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else float("nan")


def _check_positive(**values) -> None:
    for name, v in values.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise ParameterError(f"{name} must be a positive number or None, got {v!r}")


def run_span_s(sent_s, finish_s, ok) -> float:
    """The run's default duration (s): from the first send (of any request) to the last finish of a completed
    one; NaN when none completed."""
    ok = np.asarray(ok, dtype=bool)
    if not ok.any():
        return float("nan")
    return float(np.nanmax(np.asarray(finish_s, dtype=float)[ok]) - np.nanmin(np.asarray(sent_s, dtype=float)))


def summarize_metrics(
    metrics: pd.DataFrame,
    itl_ms=None,
    *,
    duration_s: float,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> dict:
    """Every summary number (``BENCHMARK_KEYS``) from per-request metrics: the one implementation behind
    ``summarize`` and ``benchmark_summary`` here, and the simulator's summaries.

    ``metrics``: one row per request with ``ok``, ``prompt_tokens``, ``output_tokens``, ``ttft_ms``, ``tpot_ms``,
    ``e2e_ms``, ``max_itl_ms`` (``request_metrics``' columns, or the simulator's compact ones); ``itl_ms``: the
    inter-token gaps of the completed requests, pooled (ms), or None when no per-token times were kept (the ITL
    statistics are then NaN, ``max_itl_ms`` still comes from ``metrics``). ``duration_s``: the run's span (s;
    ``run_span_s``), NaN or 0 leaves the rates NaN. Goodput counts completed requests whose TTFT ≤ ``slo_ttft_ms``
    and TPOT ≤ ``slo_tpot_ms`` (an SLO left at None is not checked; a single-token request has no TPOT and meets
    a TPOT SLO, as in vLLM).
    """
    _check_positive(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    done = metrics.loc[metrics["ok"].to_numpy(dtype=bool)]
    itl = np.asarray([] if itl_ms is None else itl_ms, dtype=float)
    out = {}
    for name, vals in (("ttft", done["ttft_ms"]), ("tpot", done["tpot_ms"]), ("itl", itl), ("e2e", done["e2e_ms"])):
        for p in PERCENTILES:
            out[f"{name}_p{p}_ms"] = _pct(vals, p)
        out[f"{name}_mean_ms"] = _mean(vals)
    out["max_itl_ms"] = float(done["max_itl_ms"].max()) if len(done) else float("nan")
    good = np.ones(len(done), dtype=bool)
    if slo_ttft_ms is not None:
        good &= (done["ttft_ms"] <= slo_ttft_ms).to_numpy()
    if slo_tpot_ms is not None:
        good &= (done["tpot_ms"].fillna(0.0) <= slo_tpot_ms).to_numpy()
    span = duration_s if duration_s and duration_s > 0 else float("nan")
    out["total_input_tokens"] = int(done["prompt_tokens"].sum())
    out["total_output_tokens"] = int(done["output_tokens"].sum())
    out["throughput_tok_s"] = float(done["output_tokens"].sum()) / span
    out["total_token_throughput_tok_s"] = (out["total_input_tokens"] + out["total_output_tokens"]) / span
    out["request_throughput"] = len(done) / span
    out["goodput_req_s"] = int(good.sum()) / span
    out["completed"] = int(len(done))
    out["failed"] = int(len(metrics) - len(done))
    out["duration_s"] = float(duration_s) if duration_s is not None else float("nan")
    return {k: out[k] for k in BENCHMARK_KEYS}


def _records_summary(records, *, slo_ttft_ms, slo_tpot_ms, duration_s) -> dict:
    _check_positive(slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, duration_s=duration_s)
    r = check_records(records)
    m = request_metrics(r)
    if duration_s is None:
        duration_s = run_span_s(r["sent_s"], r["finish_s"], r["ok"])
    itl = [g for ok, gaps in zip(m["ok"], m["itl"], strict=True) if ok for g in gaps]
    return summarize_metrics(m, itl, duration_s=duration_s, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)


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

    ``duration_s`` defaults to the span from the first send to the last finish (``run_span_s``). Goodput as in
    ``summarize_metrics`` (with no SLO given, goodput equals request throughput).
    """
    s = _records_summary(records, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, duration_s=duration_s)
    return {k: s[k] for k in SUMMARY_KEYS}


def benchmark_summary(
    records: pd.DataFrame,
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    duration_s: float | None = None,
) -> dict:
    """``summarize`` plus what vLLM's ``benchmark_serving`` prints (keys ``BENCHMARK_KEYS``): the run's duration
    (s), total input and output tokens of the completed requests, total-token throughput (tokens/s) and the mean
    of each latency (ms). ``servelab.loadgen.report.format_report`` prints it in vLLM's layout."""
    return _records_summary(records, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, duration_s=duration_s)
