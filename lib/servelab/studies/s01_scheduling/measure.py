"""Study 1's measuring path: the machine's record and ceilings, then each model served over HTTP with every scheduling
policy under a Poisson load (``sweep.run_study``), and the capacity search. It writes raw tables only:

- ``requests``: one row per request (its arrival, send, every token's time, whether it completed or was cut);
- ``steps``: the server's engine steps during each point (the step log on the requests' time axis);
- ``points``: one row per load point, the facts of its run the requests cannot give back (its rate, the window it
  was sized for, attempts, the run's duration, the ITL SLO in force, the warm-up's time) and its status:
  ``skipped: time budget`` or ``error: ...`` for a point this run did not measure (``run.json`` lists them too);
- ``probes``: each model's capacity probe; ``servers``: each model's server (load time, KV pool, graphs).

Every summary statistic, the capacity at the SLO, the stall statistic and the verdicts are the reporting path's
(``report.py``), computed from these files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s01_scheduling.sweep import run_study

STUDY = "01_scheduling"

# The full profile's parts, each one GPU run (selectors: ``sizing.check_selectors``). A part holds whole policy
# settings of one model (FCFS on the 8B shape, which completes about one request a second, is split by rate): its
# rate sweep, its capacity search and, for the 8B shape, the budget sweep. Every part offers the same rates per model
# (``params.LEGACY_CAPACITY_REQ_S``), so a policy's points pair with another part's on the same traces.
Q, L = "qwen2-0.5b", "llama-3-8b"
PART_SELECTORS = {
    "qwen-eager-chunked512": [f"{Q}/eager_cont_batch", f"{Q}/chunked_prefill@512"],
    "qwen-fcfs-chunked2048": [f"{Q}/fcfs", f"{Q}/chunked_prefill@2048"],
    "llama-eager": [f"{L}/eager_cont_batch"],
    "llama-chunked512": [f"{L}/chunked_prefill@512"],
    "llama-chunked2048": [f"{L}/chunked_prefill@2048"],
    "llama-budget-small": [f"{L}/budget@128", f"{L}/budget@256"],
    "llama-budget-large": [f"{L}/budget@1024", f"{L}/budget@4096"],
    "llama-fcfs-low": [f"{L}/fcfs/0.3"],
    "llama-fcfs-mid": [f"{L}/fcfs/0.7"],
    "llama-fcfs-high": [f"{L}/fcfs/1.2"],
}
# Expected minutes on the H200 per part, from the legacy run's requests and servers (``gpu_time``: server start,
# probe, each point's window at the completion rate that run measured, second attempts, the capacity search), rounded
# up; a part's ``time_budget_s`` (390 s) skips what would overrun, and says so.
PARTS = {
    "qwen-eager-chunked512": 3.5,
    "qwen-fcfs-chunked2048": 5.5,
    "llama-eager": 6.0,
    "llama-chunked512": 4.5,
    "llama-chunked2048": 6.0,
    "llama-budget-small": 4.0,
    "llama-budget-large": 4.0,
    "llama-fcfs-low": 7.0,
    "llama-fcfs-mid": 5.0,
    "llama-fcfs-high": 3.0,
}
# the points table: what a point's run recorded that its requests cannot give back
POINT_COLUMNS = [
    "model",
    "scheduler",
    "budget",
    "rate",
    "rate_fraction",
    "sweep",
    "status",
    "attempts",
    "first_window_s",
    "min_requests",
    "window_s",
    "deadline_s",
    "duration_s",
    "slo_itl_ms",
    "warmup_ms",
    "t0_perf_s",
    "traceback",
]


def part_params(P: dict) -> dict:
    """``P`` with ``parts`` set from ``P['part']``: a named part's selectors, or (``"all"``) ``P['parts']`` as given
    (None: every point)."""
    part = str(P.get("part") or "all")
    if part == "all":
        return dict(P)
    if part not in PART_SELECTORS:
        raise ParameterError(f"Study 1 has no part {part!r}; its parts: {', '.join(PART_SELECTORS)} (or 'all')")
    from servelab.studies.s01_scheduling.sizing import check_selectors

    return {**P, "parts": check_selectors(PART_SELECTORS[part], P)}


def points_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows reduced to ``POINT_COLUMNS`` (the raw facts; statistics are recomputed when reported)."""
    return summary.reindex(columns=[c for c in POINT_COLUMNS if c in summary.columns or c != "traceback"])


def measure(P: dict) -> Path:
    """Measure the machine, then every selected point of the part; the run's folder. A point the time budget or an
    error left out is a row of ``points`` with its status, and ``run.json``'s ``skipped`` names it."""
    P = part_params(P)
    with quiet_run():
        dev = device_record()
        ceil = measure_ceilings()
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        log: list[str] = []
        data = run_study(
            P,
            tempfile.mkdtemp(prefix="study01-"),
            device="cuda" if dev.kind == "cuda" else "cpu",
            roofline=Roofline.from_ceilings(ceil),
            progress=False,
            log=log.append,
        )
        frames = data.frames()
        for name in ("requests", "steps", "probes", "servers"):
            if not frames[name].empty:
                res.write(name, frames[name])
        points = points_frame(frames["summary"])
        res.write("points", points)
        missed = points[points["status"].astype(str) != "ok"] if len(points) else points
        skipped = [
            f"{r.model} {r.scheduler}@{r.budget} {r.sweep} {r.rate_fraction:g}: {r.status}" for r in missed.itertuples()
        ]
        res.finish(skipped=skipped, log=log[-50:])
        return res.dir
