"""Study 1 sized for statistics: the p99 of per-request maximum ITL and its bootstrap interval (on the committed legacy
run, read through its RunSet, against the old single-maximum rule), points sized to complete min_requests, the
capacities a run's probes give."""

import time

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.loadgen.lengths import ShareGPTLike
from servelab.paths import DATA_DIR
from servelab.studies.common.rules import OLD_RULES
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s01_scheduling import report, sizing, verdicts
from servelab.studies.s01_scheduling.params import study_params
from servelab.studies.s01_scheduling.stall import p99_of_max_itl, with_stall_stats
from servelab.studies.s01_scheduling.sweep import Point, point_trace


def test_p99_of_max_itl_and_its_interval():
    x = np.arange(1.0, 201.0)  # 200 requests whose worst gaps are 1..200 ms
    s = p99_of_max_itl([*x, np.nan])  # a request with one token has no gap: left out
    assert s["stall_requests"] == 200 and s["max_itl_p99_ms"] == pytest.approx(np.percentile(x, 99))
    assert s["max_itl_p99_lo_ms"] < s["max_itl_p99_ms"] <= s["max_itl_p99_hi_ms"] <= 200.0
    assert p99_of_max_itl(x, seed=1) != p99_of_max_itl(x, seed=2) and p99_of_max_itl(x) == p99_of_max_itl(x)
    # one outlier among 200 moves the maximum, hardly the p99
    y = p99_of_max_itl([*x[:-1], 5000.0])
    assert y["max_itl_p99_ms"] < 250 and max(x[:-1].max(), 5000.0) == 5000.0
    one = p99_of_max_itl([7.0])
    assert one["max_itl_p99_ms"] == 7.0 and np.isnan(one["max_itl_p99_lo_ms"])
    assert p99_of_max_itl([])["stall_requests"] == 0
    with pytest.raises(ParameterError, match="resamples"):
        p99_of_max_itl(x, resamples=0)


def _legacy() -> RunSet:
    """The committed H200 run (runs/legacy/all/r0), read as the page reads a run."""
    runs = study_runs("01_scheduling", DATA_DIR / "results", device="h200").at("legacy")
    assert runs.measured and runs.fingerprint == "legacy" and runs.parts == ["all"]
    return runs.repeat(runs.repeats[0])


def test_committed_run_gains_the_statistic_and_the_old_rule_reads_its_verdict():
    rep = _legacy()
    s = with_stall_stats(rep.table("summary"), rep.table("requests"))  # its summary lacks the statistic: filled
    ok = s[s["status"] == "ok"]
    assert (ok["max_itl_p99_ms"] <= ok["max_itl_ms"] + 1e-9).all() and (ok["stall_requests"] == ok["completed"]).all()
    # the report recomputes the same statistic from the raw requests alone
    r = report.repeat_summary(rep).set_index(report.KEYS)
    ok_r = r[r["status"] == "ok"]
    assert (ok_r["max_itl_p99_ms"] <= ok_r["max_itl_ms"] + 1e-9).all()
    assert (ok_r["stall_requests"] == ok_r["completed"]).all()
    old = OLD_RULES["f11_single_max"](rep)
    committed = rep.table("findings").set_index("id").loc["F1.1", "verdict"]
    assert old.verdict == committed and "70.01%" in old.detail  # the single-maximum rule is the run's committed rule
    new = verdicts.f11(s, 512)
    assert "p99 of per-request max ITL" in new.measured_value and "maximum" in new.measured_value


def test_points_are_sized_to_complete_min_requests():
    P = study_params("full")
    assert sizing.window_s(P, 10.0, None) == pytest.approx(150 * 1.15 / 10)  # served as fast as offered
    assert sizing.window_s(P, 10.0, 5.0) == pytest.approx(150 * 1.15 / 5)  # saturated: sized by what it serves
    assert sizing.window_s(P, 0.5, None) == P["point_cap_s"]  # capped: the shortfall is recorded
    with pytest.raises(ParameterError, match="rate"):
        sizing.window_s(P, 0.0, None)
    # every point of one rate replays a prefix of one trace: paired policies see the same requests
    lengths = ShareGPTLike(prompt_scale=0.05, output_scale=0.05, prompt_max=300, output_max=40)
    pt = Point("config:tiny-llama", "fcfs", 512, 0.5, "rate", seed=3, rate=20.0)
    short, long = point_trace(pt, P, lengths, 2.0).frame, point_trace(pt, P, lengths, 9.0).frame
    assert len(short) == 40 and len(long) == 180
    pd.testing.assert_frame_equal(short, long.head(40))


def test_policies_at_one_rate_replay_the_same_window_after_one_saturates(monkeypatch):
    """The first window at a rate is the model's, never a policy's carried completion rate: a policy that saturated
    at a higher rate (and served the lower one in full) replays the same requests as the others there; only a point
    that falls short runs again, sized by its own completion rate."""
    from servelab.studies.s01_scheduling import sweep

    P = study_params("full")
    capacity = 50.0
    windows: dict = {}

    def fake_run_point(srv, worker, pt, P, lengths, workdir, slo, served_req_s=None):
        window = sizing.window_s(P, pt.rate, served_req_s)
        windows.setdefault((pt.scheduler, pt.rate_fraction), []).append(window)
        # chunked_prefill saturates at the highest rate only (completes 10 req/s there)
        done = 10.0 if (pt.scheduler == "chunked_prefill" and pt.rate > capacity) else pt.rate
        completed = int(min(pt.rate * window, done * (window + P["drain_s"])))
        arrived = int(pt.rate * window)
        row = {"status": "ok", "attempts": 1, "completed": completed, "cut": arrived - completed,
               "shortfall": max(0, P["min_requests"] - completed), "duration_s": window + P["drain_s"]}  # fmt: skip
        return pd.DataFrame(), pd.DataFrame(), row

    monkeypatch.setattr(sweep, "run_point", fake_run_point)
    monkeypatch.setattr(sweep, "point_span_s", lambda pt, P, lengths, window: window)
    srv = type("Srv", (), {"alive": True})()
    sw = sweep._Sweep(P, None, None, None, sweep.StudyData(), time.perf_counter() + 1e6, _NoBar(), print)
    sw.rates_from["m"] = capacity
    for fraction in (1.2, 0.7):  # the most loaded rate runs first, as in the sweep
        for scheduler, budget in (("chunked_prefill", 512), ("eager_cont_batch", 8192)):
            pt = Point("m", scheduler, budget, fraction, "rate", seed=0, rate=fraction * capacity)
            sweep._measure_point(sw, srv, pt, P, slo=None)
    first = sizing.window_s(P, 60.0, capacity)
    own = int(10.0 * (first + P["drain_s"])) / (first + P["drain_s"])  # what it completed per second of the run
    assert windows[("chunked_prefill", 1.2)] == [first, sizing.window_s(P, 60.0, own)]  # short: again, by itself
    assert windows[("eager_cont_batch", 1.2)] == [first]
    assert windows[("chunked_prefill", 0.7)] == windows[("eager_cont_batch", 0.7)] == [sizing.window_s(P, 35.0, 50)]


class _NoBar:
    def update(self, n):
        pass


def test_capacities_from_a_results_folder():
    folder = _legacy().runs[0].dir  # a run folder, named relative to the repository
    caps = sizing.capacities(str(folder.relative_to(DATA_DIR.parent)))
    assert set(caps) == {"config:qwen2-0.5b", "config:llama-3-8b"} and all(c > 0 for c in caps.values())
    assert sizing.capacities(str(folder)) == caps  # or absolute
    with pytest.raises(ParameterError, match="probes.csv"):
        sizing.capacities("no/such/folder")
