import time

import pytest

from servelab.measure.timing import summarize, time_fn


def test_summarize_median_quartiles_and_ci():
    t = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_ms == 3.0
    assert t.p25_ms == 2.0 and t.p75_ms == 4.0
    assert t.iqr_ms == 2.0
    assert t.ci_low_ms <= t.median_ms <= t.ci_high_ms
    assert t.min_ms == 1.0 and t.repeats == 5


def test_summarize_rejects_empty_and_nan():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_time_fn_measures_sleep_on_cpu():
    calls = []
    t = time_fn(lambda: (calls.append(1), time.sleep(0.01)), warmup=2, repeats=5, device="cpu")
    assert len(calls) == 7  # warm-up calls are made but not timed
    assert t.clock == "perf_counter"
    assert 9.0 <= t.median_ms <= 60.0


def test_time_fn_runs_before_each_untimed():
    seen = []
    t = time_fn(
        lambda: seen.append("fn"),
        before_each=lambda: (seen.append("reset"), time.sleep(0.02)),
        warmup=1,
        repeats=3,
        device="cpu",
    )
    assert seen == ["reset", "fn"] * 4
    assert t.median_ms < 15.0  # the 20 ms reset is outside the timed region


def test_time_fn_rejects_bad_counts():
    with pytest.raises(ValueError):
        time_fn(lambda: None, repeats=0, device="cpu")
