"""The full profile's GPU time, estimated from a committed run, and its points grouped into GPU runs (``parts``).

Each point's seconds follow ``sizing.window_s`` at the rate the committed run offered and the rate it completed
(``served_req_s``): the estimate of "requests per second at each point × ``min_requests``", capped at
``point_cap_s``. ``plan_parts`` groups whole policy settings into runs of at most ``time_budget_s``.

    python -m servelab.studies.s01_scheduling.gpu_time [RESULTS_FOLDER]
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s01_scheduling.sizing import (
    BUDGET,
    arrivals,
    load_guess_s,
    point_cost_s,
    setting,
    short,
    window_s,
)
from servelab.studies.s01_scheduling.sweep import plan_points


def _served_req_s(row) -> float:
    """A measured point's completion rate (req/s): the offered rate where nothing was cut, else what it completed
    per second of its run (it was saturated)."""
    if row["cut"] > 0 and row["duration_s"] > 0:
        return float(row["completed"]) / float(row["duration_s"])
    return float(row["rate"])


def gpu_time_table(summary: pd.DataFrame, P: dict) -> pd.DataFrame:
    """Per point of ``P``'s plan: the window, seconds and expected completed requests under ``P`` (its
    ``min_requests``, ``point_cap_s``), from a committed run's ``summary`` (its rates and completion rates). A point
    that run did not measure takes the completion rate of the same model's ChunkedPrefill point at the nearest
    budget and the same rate fraction (``estimated_from`` names it)."""
    ok = summary[summary["status"] == "ok"]
    rows = []
    for model in P["models"]:
        m = ok[ok["model"] == model]
        for pt in plan_points({**P, "parts": None}, model):
            same = m[(m["scheduler"] == pt.scheduler) & (m["rate_fraction"] == pt.rate_fraction)]
            exact = same[same["budget"] == pt.budget]
            src = exact if len(exact) else same.iloc[(same["budget"] - pt.budget).abs().argsort()[:1]]
            if src.empty:
                continue
            r = src.iloc[0]
            served = _served_req_s(r)
            w = window_s(P, float(r["rate"]), served)
            rows.append(
                {
                    "model": model,
                    "setting": BUDGET if pt.sweep == "budget" else setting(pt.scheduler, pt.budget),
                    "scheduler": pt.scheduler,
                    "budget": pt.budget,
                    "rate_fraction": pt.rate_fraction,
                    "sweep": pt.sweep,
                    "rate": float(r["rate"]),
                    "served_req_s": served,
                    "window_s": w,
                    "point_s": point_cost_s(P, w),
                    "expected_completed": min(arrivals(float(r["rate"]), w), served * (w + P["drain_s"])),
                    "capped": w >= P["point_cap_s"],
                    "estimated_from": "" if len(exact) else f"chunked_prefill@{int(r['budget'])}",
                }
            )
    return pd.DataFrame(rows)


def plan_parts(table: pd.DataFrame, P: dict) -> list[dict]:
    """Group ``gpu_time_table``'s points into runs of at most ``time_budget_s`` seconds (a model's load and probe
    counted in each run that serves it), whole settings at a time, in plan order: ``[{"parts": [...], "s": ...}]``.
    A model whose settings all fit one run is selected by its name alone."""
    fixed = load_guess_s(P) + P["probe_s"]
    out = []
    for model, g in table.groupby("model", sort=False):
        per = g.groupby("setting", sort=False)["point_s"].sum()
        runs, cur, total = [], [], fixed
        for name, s in per.items():
            if cur and total + s > P["time_budget_s"]:
                runs.append((cur, total))
                cur, total = [], fixed
            cur, total = [*cur, name], total + s
        runs.append((cur, total))
        for names, s in runs:
            sel = [short(model)] if len(runs) == 1 else [f"{short(model)}/{n}" for n in names]
            out.append({"parts": sel, "s": s})
    return out


def main(folder: str = "data/results/nvidia-h200/01_scheduling") -> None:
    """Print the full profile's GPU time per point and per run, from the committed run in ``folder``."""
    from servelab.paths import DATA_DIR
    from servelab.studies.s01_scheduling.params import study_params

    P = study_params("full")
    table = gpu_time_table(pd.read_csv(DATA_DIR.parent / folder / "summary.csv"), P)
    cols = ["model", "setting", "rate_fraction", "rate", "served_req_s", "window_s", "point_s", "expected_completed"]
    print(table[cols].round(1).to_string(index=False))
    print(f"points: {table['point_s'].sum():.0f} s; capped (short of min_requests): {int(table['capped'].sum())}")
    for r in plan_parts(table, P):
        print(f"run {r['s']:.0f} s: parts={','.join(r['parts'])}")


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:])
