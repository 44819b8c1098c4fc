"""vLLM's serving metrics from hand-made records, whose answers are known exactly."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.loadgen.metrics import (
    BENCHMARK_KEYS,
    RECORD_COLUMNS,
    SUMMARY_KEYS,
    benchmark_summary,
    check_records,
    empty_records,
    records_for_csv,
    request_metrics,
    summarize,
)
from servelab.loadgen.report import format_report, parse_report


def record(rid, sent, times, ok=True, arrival=None, prompt=10, error=""):
    return {
        "request_id": rid,
        "arrival_s": sent if arrival is None else arrival,
        "prompt_tokens": prompt,
        "output_tokens": len(times),
        "sent_s": sent,
        "first_token_s": times[0] if times else np.nan,
        "finish_s": times[-1] if times else np.nan,
        "token_times_s": times,
        "ok": ok,
        "error": error,
    }


@pytest.fixture
def records():
    return pd.DataFrame(
        [
            record(0, 0.0, [0.100, 0.110, 0.120, 0.130]),  # TTFT 100 ms, gaps 10 ms, E2E 130
            record(1, 0.5, [0.550, 0.570, 0.650]),  # TTFT 50, gaps 20 and 80, E2E 150
            record(2, 1.0, [1.300]),  # one token: TTFT 300, no TPOT
            record(3, 1.2, [1.25], ok=False, error="HTTP 500"),  # failed: not counted
        ]
    )


def test_request_metrics_follow_vllm_definitions(records):
    m = request_metrics(records).set_index("request_id")
    assert m.loc[0, "ttft_ms"] == pytest.approx(100)
    assert m.loc[0, "e2e_ms"] == pytest.approx(130)
    assert m.loc[0, "tpot_ms"] == pytest.approx(30 / 3)  # (E2E - TTFT) / (n - 1)
    assert m.loc[1, "tpot_ms"] == pytest.approx(100 / 2)
    assert m.loc[1, "itl"] == pytest.approx([20, 80])
    assert m.loc[1, "max_itl_ms"] == pytest.approx(80)
    assert math.isnan(m.loc[2, "tpot_ms"]) and m.loc[2, "itl"] == []
    assert math.isnan(m.loc[3, "ttft_ms"]) and not m.loc[3, "ok"]


def test_summarize_pools_itl_and_counts(records):
    s = summarize(records, duration_s=2.0)
    assert set(s) == set(SUMMARY_KEYS)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["max_itl_ms"] == pytest.approx(80)
    assert s["itl_p50_ms"] == pytest.approx(np.percentile([10, 10, 10, 20, 80], 50))
    assert s["ttft_p50_ms"] == pytest.approx(100)
    assert s["throughput_tok_s"] == pytest.approx((4 + 3 + 1) / 2.0)
    assert s["request_throughput"] == pytest.approx(3 / 2.0)
    assert s["goodput_req_s"] == s["request_throughput"]  # no SLO given


def test_goodput_applies_every_slo(records):
    # TTFT <= 120 ms keeps requests 0 and 1; TPOT <= 20 ms then drops request 1 (50 ms)
    assert summarize(records, slo_ttft_ms=120, duration_s=1.0)["goodput_req_s"] == pytest.approx(2)
    assert summarize(records, slo_ttft_ms=120, slo_tpot_ms=20, duration_s=1.0)["goodput_req_s"] == pytest.approx(1)
    # the one-token request has no TPOT and meets a TPOT SLO
    assert summarize(records, slo_tpot_ms=20, duration_s=1.0)["goodput_req_s"] == pytest.approx(2)


def test_default_duration_is_first_send_to_last_finish(records):
    s = summarize(records)
    assert s["request_throughput"] == pytest.approx(3 / 1.3)


def test_csv_round_trip_keeps_token_times(records, tmp_path):
    path = tmp_path / "r.csv"
    records_for_csv(records).to_csv(path, index=False)
    back = pd.read_csv(path, keep_default_na=False, na_values=[""])
    assert json.loads(back.loc[1, "token_times_s"]) == pytest.approx([0.55, 0.57, 0.65])
    assert summarize(back, duration_s=2.0) == pytest.approx(summarize(records, duration_s=2.0), nan_ok=True)


def test_bad_input_is_named():
    with pytest.raises(ParameterError, match="lack columns"):
        summarize(pd.DataFrame({"request_id": [0]}))
    with pytest.raises(ParameterError, match="slo_ttft_ms"):
        summarize(empty_records(), slo_ttft_ms=-1)
    with pytest.raises(ParameterError, match="DataFrame"):
        check_records([{"a": 1}])


def test_empty_run_summarizes_to_nans():
    s = summarize(empty_records())
    assert list(empty_records().columns) == RECORD_COLUMNS
    assert s["completed"] == 0 and s["failed"] == 0 and math.isnan(s["ttft_p99_ms"])


def test_benchmark_summary_adds_vllms_totals_and_means(records):
    s = benchmark_summary(records, duration_s=2.0)
    assert list(s) == BENCHMARK_KEYS and set(SUMMARY_KEYS) <= set(s)
    assert {k: s[k] for k in SUMMARY_KEYS} == pytest.approx(summarize(records, duration_s=2.0), nan_ok=True)
    assert s["duration_s"] == 2.0
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 8  # the failed request is not counted
    assert s["total_token_throughput_tok_s"] == pytest.approx((30 + 8) / 2.0)
    assert s["ttft_mean_ms"] == pytest.approx((100 + 50 + 300) / 3)
    assert s["tpot_mean_ms"] == pytest.approx((10 + 50) / 2)  # the one-token request has no TPOT
    assert s["itl_mean_ms"] == pytest.approx(np.mean([10, 10, 10, 20, 80]))
    assert s["e2e_mean_ms"] == pytest.approx((130 + 150 + 300) / 3)
    assert benchmark_summary(records)["duration_s"] == pytest.approx(1.3)  # first send to last finish


def test_report_has_vllms_layout(records):
    s = benchmark_summary(records, duration_s=2.0)
    lines = format_report(s).splitlines()
    # vLLM: the title centred in 50 '=' , then "{:<40} {:<10}" rows, '-' section bars, a closing bar
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert lines[1] == f"{'Successful requests:':<40} {3:<10}"
    assert lines[2] == f"{'Failed requests:':<40} {1:<10}"
    assert lines[3] == f"{'Benchmark duration (s):':<40} {2.0:<10.2f}"
    rows = parse_report("\n".join(lines))
    assert rows["Total input tokens:"] == 30 and rows["Total generated tokens:"] == 8
    assert rows["Request throughput (req/s):"] == 1.5
    assert rows["Output token throughput (tok/s):"] == 4.0 and rows["Total Token throughput (tok/s):"] == 19.0
    assert rows["Median TTFT (ms):"] == 100.0 and rows["Mean E2EL (ms):"] == round((130 + 150 + 300) / 3, 2)
    assert rows["P99 ITL (ms):"] == round(np.percentile([10, 10, 10, 20, 80], 99), 2)
    assert len(rows) == 8 + 4 * 3  # every row parsed: 8 totals and rates, mean/median/P99 of four latencies
    assert "Request goodput (req/s):" not in rows
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert "----------------End-to-end Latency----------------" in lines
    assert all(len(ln) == 50 for ln in lines if set(ln[:3]) <= {"=", "-"})
    with_slo = format_report(benchmark_summary(records, slo_ttft_ms=120, duration_s=1.0), goodput=True)
    assert f"{'Request goodput (req/s):':<40} {2.0:<10.2f}" in with_slo.splitlines()
