"""F1.3 compares mean TTFT over the same requests for every setting at a rate, a request with no first token by the
earliest deadline counted at that deadline: a policy that cuts its slowest requests is no longer credited for it,
and the old rule (completed requests only) still says what it said."""

import json

import numpy as np
import pandas as pd

from servelab.studies.common.rules import OLD_RULES, load_registry
from servelab.studies.s01_scheduling import verdicts
from servelab.studies.s01_scheduling.summary import summary_table

MODEL = "config:qwen2-0.5b"


def _point(scheduler: str, budget: int, rate_fraction: float, deadline_s: float) -> dict:
    return dict(model=MODEL, scheduler=scheduler, budget=budget, rate=10 * rate_fraction, rate_fraction=rate_fraction,
                sweep="rate", status="ok", attempts=1, min_requests=4, window_s=deadline_s - 5, deadline_s=deadline_s,
                duration_s=deadline_s, slo_itl_ms=50.0, warmup_ms=1.0)  # fmt: skip


def _requests(point: dict, ttfts_s: list[float | None]) -> pd.DataFrame:
    """One request per TTFT, arriving 1 s apart (the same trace for every setting); None: cut with no token."""
    rows = []
    for i, ttft in enumerate(ttfts_s):
        sent = float(i)
        times = [] if ttft is None else list(np.round(sent + ttft + np.arange(5) * 0.01, 6))
        ok = bool(times) and times[-1] <= point["deadline_s"]
        rows.append({k: point[k] for k in ("model", "scheduler", "budget", "rate", "rate_fraction", "sweep")}
                    | dict(request_id=i, arrival_s=sent, prompt_tokens=50, output_tokens=len(times), sent_s=sent,
                           first_token_s=times[0] if times else np.nan, finish_s=times[-1] if times else np.nan,
                           token_times_s=json.dumps(times), ok=ok, error=np.nan if ok else "cut at the run's deadline",
                           target_output_tokens=5))  # fmt: skip
    return pd.DataFrame(rows)


def _sweep(fcfs_ttfts, eager_ttfts, deadline_s=10.0):
    """Two rates: at 0.2 both serve everything in 0.1 s; at 0.8 the given TTFTs."""
    points, reqs = [], []
    for scheduler, budget, top in (("fcfs", 8192, fcfs_ttfts), ("eager_cont_batch", 8192, eager_ttfts)):
        for fraction, ttfts in ((0.2, [0.1] * 6), (0.8, top)):
            p = _point(scheduler, budget, fraction, deadline_s)
            points.append(p)
            reqs.append(_requests(p, ttfts))
    return summary_table(pd.DataFrame(points), pd.concat(reqs, ignore_index=True))


def test_a_request_cut_before_its_first_token_counts_at_the_deadline():
    # FCFS serves its first two requests at once and never starts the other four; EagerContBatch serves all six
    s = _sweep([0.1, 0.1, None, None, None, None], [0.5] * 6)
    top = s[s["rate_fraction"] == 0.8].set_index("scheduler")
    assert np.isclose(top.loc["fcfs", "mean_ttft_ms"], 100.0)  # completed requests alone: FCFS looks 5x faster
    # counted at the deadline (10 s) from their send times 2..5 s: (0.1 + 0.1 + 8 + 7 + 6 + 5) / 6 s
    assert np.isclose(top.loc["fcfs", "common_ttft_ms"], 1e3 * 26.2 / 6)
    assert top.loc["fcfs", "common_censored"] == 4 and top.loc["eager_cont_batch", "common_censored"] == 0
    assert np.isclose(top.loc["eager_cont_batch", "common_ttft_ms"], 500.0)
    new, old = verdicts.f13(s), verdicts.f13(s, ttft=verdicts.COMPLETED_TTFT)
    assert "lowest mean TTFT at 2/2 rates" in new.measured_value
    assert "lowest mean TTFT at 1/2 rates" in old.measured_value
    assert "4 of the 6 requests compared had no first token by the deadline under FCFS" in new.measured_value


def test_settings_compare_on_their_common_requests_and_the_earliest_deadline():
    """A setting that ran a longer second attempt offered more requests and waited longer: only the shared prefix,
    up to the earlier deadline, is compared."""
    pts = [_point("fcfs", 8192, 0.8, 20.0), _point("eager_cont_batch", 8192, 0.8, 10.0)]
    reqs = pd.concat(
        [_requests(pts[0], [0.1, 0.1, 12.0, 0.1, 0.1, 0.1, 0.1, 0.1]), _requests(pts[1], [0.2] * 6)],
        ignore_index=True,
    )
    s = summary_table(pd.DataFrame(pts), reqs).set_index("scheduler")
    assert (s["common_requests"] == 6).all()
    # FCFS's request 2 got its first token at 14 s, after the 10 s horizon: counted at 10 - 2 = 8 s
    assert s.loc["fcfs", "common_censored"] == 1
    assert np.isclose(s.loc["fcfs", "common_ttft_ms"], 1e3 * (0.1 * 5 + 8.0) / 6)
    assert s.loc["fcfs", "mean_ttft_ms"] > s.loc["fcfs", "common_ttft_ms"]  # its own mean saw the 12 s wait


def test_nothing_cut_gives_the_plain_mean():
    s = _sweep([0.3] * 6, [0.2] * 6)
    ok = s.dropna(subset=["common_ttft_ms"])
    assert np.allclose(ok["common_ttft_ms"], ok["mean_ttft_ms"]) and (ok["common_censored"] == 0).all()


def test_the_change_is_registered_with_its_old_rule():
    rule = load_registry()["F1.3"]
    last = rule.changes[-1]
    assert last.old_verdict == "f13_completed_requests_only" and last.old_verdict in OLD_RULES
    assert "completed" not in rule.rule and "no first token by the earliest deadline" in rule.rule
