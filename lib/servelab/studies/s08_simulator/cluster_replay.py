"""The simulator against real replicas on the same traces (the "Beyond one GPU" page; issue 31).

Each point a capacity run measured (N replicas behind a router at one rate; ``servelab.cluster.capacity_run``) is
replayed by the simulator on its own trace: the requests' send times as the records hold them, the output lengths
asked for and the prompt ids the run sent (``capacity_run.point_trace`` re-draws the run's trace from its
parameters; the prefix-affinity router keys on the ids), on N simulated replicas behind the same router, with the
prediction's cost model and scheduler settings. The simulated records are cut where the load generator stopped
listening, as Study 1's replays are (``validation.cut_at``), and summarised as the load generator summarised the
real point (its row of ``points.csv``); the two are compared metric by metric as ``sim_validation.csv`` compares
Study 1's runs (``validation.compare``: error = (sim - real) / real), with p99 TPOT (the SLO's second term) beside
its metrics, and whether each met the SLO.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servelab.cluster import capacity_run
from servelab.loadgen.metrics import summarize
from servelab.sim.capacity import meets_slo
from servelab.sim.routers import ROUTERS
from servelab.sim.simulator import simulate
from servelab.studies.s08_simulator import validation

EXTRA = {"tpot_p99_ms": "p99 TPOT"}  # the SLO's TPOT term, which sim_validation's metrics leave out


def read_requests(run: Path) -> pd.DataFrame:
    """A run's request records (``requests.csv``, or its xz form: ``scripts/compress_runs.sh``)."""
    path = run / "requests.csv"
    req = pd.read_csv(path if path.exists() else run / "requests.csv.xz", keep_default_na=False, na_values=[""])
    req["error"] = req["error"].fillna("")
    return req


def replay_point(P: dict, records: pd.DataFrame, real: dict, router: str, n: int, rate: float, cost,
                 sched: dict) -> list[dict]:  # fmt: skip
    """One measured point against its replay: a row per metric (``validation.compare``'s, and ``EXTRA``). ``real``:
    the load generator's summary of the point (``points.csv``, made from every token's time, which the records no
    longer hold: ``capacity_run.compact``)."""
    trace = capacity_run.point_trace(P, n, rate)
    asked = trace.frame.set_index("request_id")
    rec = records.reset_index(drop=True)
    t = validation.replay_trace(rec, asked.loc[rec["request_id"], "output_tokens"].to_numpy())
    t["prompt_ids"] = asked.loc[t["request_id"], "prompt_ids"].to_list()
    policy = ROUTERS[0] if router == capacity_run.SINGLE else router
    sim = simulate(t, cost=cost, replicas=n, router=policy, **sched)
    cut = validation.cut_at(sim.records.drop(columns="replica"), trace.duration_s + float(P["drain_s"]))
    slo_t, slo_p = float(P["slo_ttft_ms"]), float(P["slo_tpot_ms"])
    simulated = summarize(cut, slo_ttft_ms=slo_t, slo_tpot_ms=slo_p)
    met = {"real_met": bool(real["met"]), "sim_met": meets_slo(simulated, slo_t, slo_p)}
    rows = validation.compare(real, simulated)
    for key, label in EXTRA.items():
        a, b = real[key], simulated[key]
        rows.append({"metric": label, "real": a, "sim": b, "error_pct": 100.0 * (b - a) / a if a else float("nan")})
    return [{"router": router, "replicas": n, "rate": rate, **row, **met} for row in rows]


def replay_run(run: Path, cost, sched: dict) -> pd.DataFrame:
    """Every point of one capacity run (one part of a repeat) against its replay."""
    P = json.loads((run / "run.json").read_text())["params"]
    points = pd.read_csv(run / "points.csv").set_index(["router", "replicas", "rate"])
    rows = []
    for (router, n, rate), rec in read_requests(run).groupby(["router", "replicas", "rate"], sort=False):
        real = points.loc[(router, n, rate)].to_dict()
        rows += replay_point(P, rec.drop(columns=["router", "replicas", "rate"]), real, router, int(n), float(rate),
                             cost, sched)  # fmt: skip
    return pd.DataFrame(rows)


def agreement(table: pd.DataFrame) -> dict:
    """Over the points of ``replay_run``'s tables: how often the replay's SLO verdict was the real one, and the
    median |error| per metric (%)."""
    points = table.drop_duplicates(["router", "replicas", "rate"])
    per_metric = table.dropna(subset=["error_pct"]).groupby("metric")["error_pct"].apply(lambda e: e.abs().median())
    return {
        "points": len(points),
        "same_verdict": int((points["real_met"] == points["sim_met"]).sum()),
        "median_abs_error_pct": per_metric.to_dict(),
    }
