"""Study 1 counts a point over the requests its run offered: a trace that ran past the run's deadline leaves its late
requests out of the point (they were never sent), and the page says how many; a capacity the repeats bracket at
different rates says so."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.studies.common.runs import Run, RunSet
from servelab.studies.s01_scheduling import report
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.summary import offered, summary_table

HEAD = dict(model="config:llama-3-8b", scheduler="eager_cont_batch", budget=8192, rate=1.0, rate_fraction=0.3,
            sweep="rate")  # fmt: skip
POINT = {**HEAD, "status": "ok", "attempts": 1, "min_requests": 4, "window_s": 10.0, "deadline_s": 15.0,
         "duration_s": 15.0, "slo_itl_ms": 20.0, "warmup_ms": 1.0}  # fmt: skip


def _requests(arrivals, late_after: float):
    """One request per arrival: 11 tokens 5 ms apart once sent; those after ``late_after`` are cut with no token, as
    the load generator records a request it never sent before the deadline."""
    rows = []
    for i, t in enumerate(arrivals):
        times = list(np.round(t + 0.01 + np.arange(11) * 0.005, 6)) if t <= late_after else []
        rows.append(dict(**HEAD, request_id=i, arrival_s=t, prompt_tokens=50, output_tokens=len(times), sent_s=t,
                         first_token_s=times[0] if times else np.nan, finish_s=times[-1] if times else np.nan,
                         token_times_s=json.dumps(times), ok=bool(times),
                         error=np.nan if times else "cut at the run's deadline", target_output_tokens=11))  # fmt: skip
    return pd.DataFrame(rows)


def test_requests_that_arrived_after_the_deadline_are_left_out_and_counted():
    reqs = _requests([0.5, 3.0, 7.0, 9.5, 16.0, 18.5], late_after=15.0)  # two arrive after the 15 s deadline
    s = summary_table(pd.DataFrame([POINT]), reqs).iloc[0]
    assert (s["requests"], s["not_offered"], s["cut"], s["completed"]) == (4, 2, 0, 4)
    # counted as cut, as before, the same point misses the SLO at a load it served in full
    before = summary_table(pd.DataFrame([{**POINT, "deadline_s": np.nan}]), reqs).iloc[0]
    assert (before["cut"], before["not_offered"]) == (2, 0)
    caps = [capacity_table(pd.DataFrame([x]))["bound"].iloc[0] for x in (s, before)]
    assert caps == ["at least highest rate", "below lowest rate"]


def test_a_request_sent_before_the_deadline_and_cut_there_still_counts_as_cut():
    reqs = _requests([0.5, 3.0, 12.0], late_after=11.0)  # the third arrived in the drain and was not served in time
    g, late = offered(reqs, 15.0)
    assert late == 0 and len(g) == 3
    assert summary_table(pd.DataFrame([POINT]), reqs).iloc[0]["cut"] == 1


def test_the_page_lists_each_point_with_late_requests_and_says_nothing_without_any():
    late = pd.DataFrame([{**HEAD, "repeat": 0, "requests": 44, "not_offered": 2}])
    runs = RunSet("01_scheduling", tuple(Run(Path(f"r{k}"), {"repeat_index": k}) for k in (0, 1, 2)))
    text = report.not_offered_lines(report.named_repeats(late, runs))
    assert text.startswith("2 requests of 1 points' traces arrived after their run's deadline")
    assert "repeat 1 of 3: llama-3-8b, EagerContBatch, rate sweep at 1.00 req/s: 2 of 46" in text  # the seed's name
    assert report.not_offered_lines(late.iloc[0:0]) == ""


def test_a_capacity_the_repeats_bracket_at_different_rates_shows_their_range():
    caps = pd.DataFrame(
        {
            "model": "config:llama-3-8b", "scheduler": "fcfs", "budget": 8192, "slo_itl_ms": 48.9,
            "capacity_req_s": [0.78, 1.56, 1.56], "first_miss_rate": [1.56, 3.12, 3.12], "lowest_rate": 0.78,
            "highest_rate": 12.5, "rates": 3, "bound": "within sweep", "repeat": [0, 1, 2],
        }
    )  # fmt: skip
    pooled = report.pool_capacity(caps).iloc[0]
    assert report.capacity_text(pooled) == (
        "1.56 req/s (the median of the repeats' 0.78–1.56 req/s, each bracketed; median first miss 3.12 req/s)"
    )
    same = report.pool_capacity(caps.assign(capacity_req_s=1.56)).iloc[0]
    assert report.capacity_text(same) == "1.56 req/s (missed at 3.12 req/s)"
