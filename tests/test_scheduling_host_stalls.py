"""Study 1's one-off host stalls: steps whose host time is a one-off event, not scheduling, are found and told."""

from pathlib import Path

import pandas as pd

from servelab.studies.common.runs import Run, RunSet
from servelab.studies.s01_scheduling.host_stalls import host_stalls
from servelab.studies.s01_scheduling.report import (
    held_up_sentence,
    host_stall_lines,
    named_repeats,
    stall_takeaway,
    with_point_stall,
)

KEYS = {"repeat": 1, "part": "p", "model": "config:qwen2-0.5b", "scheduler": "chunked_prefill", "budget": 512,
        "rate_fraction": 0.3, "sweep": "rate"}  # fmt: skip


def _named(stalls, ids=(0, 1, 2)):
    """``stalls`` named as the page names repeats, among runs of repeat ids ``ids``."""
    return named_repeats(stalls, RunSet("01_scheduling", tuple(Run(Path(f"r{k}"), {"repeat_index": k}) for k in ids)))


def _steps(rows):
    """Steps from (prefill tokens, decode tokens, host ms, step ms) rows, on one run of one setting."""
    out, t = [], 0.0
    for prefill, decode, host, ms in rows:
        out.append({**KEYS, "start_s": t, "end_s": t + ms / 1e3, "prefill_tokens": prefill, "decode_tokens": decode,
                    "host_ms": host})  # fmt: skip
        t += ms / 1e3
    return pd.DataFrame(out)


def test_a_step_stuck_on_the_host_is_found_and_ordinary_long_steps_are_not():
    rows = [(0, 5, 0.5, 1.3)] * 50 + [(507, 5, 1.0, 20.0)] * 30  # decodes, and mixed steps with a 512-token chunk
    rows += [(507, 5, 531.0, 538.0)]  # one mixed step that waited half a second on the host
    rows += [(507, 5, 90.0, 100.0)]  # long, but under the 100 ms floor
    stalls = host_stalls(_steps(rows))
    assert len(stalls) == 1
    r = stalls.iloc[0]
    assert (r["kind"], r["host_ms"], round(r["step_ms"])) == ("mixed", 531.0, 538)
    assert r["usual_host_ms"] == 1.0


def test_a_setting_whose_steps_all_spend_long_on_the_host_has_no_one_off_stall():
    # whole-prompt prefills whose launch always takes ~150 ms (a full launch queue): usual for that setting
    rows = [(6000, 0, 150.0, 300.0)] * 10 + [(0, 4, 0.5, 1.3)] * 20
    assert host_stalls(_steps(rows)).empty


def test_no_step_log_gives_no_stalls_and_says_so():
    assert host_stalls(pd.DataFrame()).empty
    assert "No step" in host_stall_lines(pd.DataFrame())
    assert stall_takeaway(pd.DataFrame()) == ""


def test_the_lines_name_the_step_and_whether_it_set_its_points_worst_stall():
    stalls = host_stalls(_steps([(0, 5, 0.5, 1.3)] * 20 + [(507, 5, 1.0, 20.0)] * 20 + [(507, 5, 531.0, 538.0)]))
    summary = pd.DataFrame([{k: v for k, v in KEYS.items() if k != "part"} | {"max_itl_p99_ms": 532.7}])
    stalls = with_point_stall(stalls, summary)
    assert stalls["point_stall_ms"].tolist() == [532.7]
    text = host_stall_lines(_named(stalls))
    assert "repeat 2 of 3: qwen2-0.5b" in text and "a mixed step (507 prefill and 5 decode tokens) took 538 ms" in text
    assert "- repeat 1 of 2: qwen2-0.5b" in host_stall_lines(_named(stalls, (1, 3)))  # by place, not data id
    assert "531 ms of it on the host" in text and "532.7 ms" in text
    assert "1 of them sets its point's worst stall" in stall_takeaway(stalls)
    elsewhere = with_point_stall(host_stalls(_steps([(0, 5, 0.5, 1.3)] * 20 + [(0, 5, 300.0, 301.0)])),
                                 summary.assign(max_itl_p99_ms=40.0))  # fmt: skip
    assert "0 of them set their point's worst stall" in stall_takeaway(elsewhere)


def test_a_log_that_times_the_collector_says_how_much_of_the_stall_was_collection():
    steps = _steps([(0, 5, 0.5, 1.3)] * 20 + [(507, 5, 1.0, 20.0)] * 20 + [(507, 5, 531.0, 538.0)])
    steps["gc_ms"] = 0.0
    steps.loc[steps.index[-1], "gc_ms"] = 512.0
    text = host_stall_lines(_named(host_stalls(steps)))
    assert "531 ms of it on the host (512 ms of it in Python's garbage collector)" in text
    assert "garbage collector)" not in host_stall_lines(_named(host_stalls(steps.drop(columns="gc_ms"))))


def test_a_repeat_that_disagrees_is_tied_to_the_host_stall_that_set_its_worst_stall():
    stalls = host_stalls(_steps([(0, 5, 0.5, 1.3)] * 20 + [(507, 5, 1.0, 20.0)] * 20 + [(507, 5, 531.0, 538.0)]))
    summary = pd.DataFrame([{k: v for k, v in KEYS.items() if k != "part"} | {"max_itl_p99_ms": 532.7}])
    held = [pd.DataFrame(), _named(with_point_stall(stalls, summary)), pd.DataFrame()]
    claim = [{"qwen2-0.5b": "holds"}, {"qwen2-0.5b": "fails"}, {"qwen2-0.5b": "holds"}]
    assert held_up_sentence(claim, held) == (
        ". qwen2-0.5b fails in repeat 2 of 3 (listed under *Steps held up on the host*), where "
        "ChunkedPrefill@512's worst stall at rate fraction 0.3, 532.7 ms, is set by one step held 531 ms on the host"
    )
    assert held_up_sentence([{"qwen2-0.5b": "holds"}] * 3, held) == ""  # repeats that agree need no tie
