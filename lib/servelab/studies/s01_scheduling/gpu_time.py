"""The full profile's GPU time per part, estimated from a committed run (the legacy H200 run by default).

Each point's seconds follow ``sizing.window_s`` at the rate the part offers and the rate the committed run completed
at that rate fraction (``served_req_s``, from its requests: completed per second of the run where requests were
cut, else the offered rate), capped at ``point_cap_s``, plus ``drain_s`` and the per-point overhead. A point's first
attempt is sized from the model's capacity, the same for every policy; where a saturated point falls short it runs
again sized by itself (``sweep._measure_point``): the estimate counts both. The capacity search adds, per setting
whose lowest measured rate missed the SLO (by the committed run's requests), ``SEARCH_GUESS`` steps down at
``search_min_requests`` each, and one step up where the highest met it. A part adds the model's server start (the
committed run's ``load_s``), its probe and the ceilings.

    python -m servelab.studies.s01_scheduling.gpu_time [RUN_FOLDER]
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s01_scheduling.sizing import point_cost_s, short, window_s
from servelab.studies.s01_scheduling.sweep import plan_points

LEGACY = "data/results/nvidia-h200/01_scheduling/runs/legacy/all/r0"
CEILINGS_S = 20.0  # device record and measured ceilings before the sweep's clock starts
PROBE_S = 6.0  # the probe's burst, its policy switch and the step-log read (legacy: 1–3 s of probe wall time)
SEARCH_GUESS = 2  # steps down a setting whose lowest rate missed the SLO is expected to need


def _served(row) -> float:
    if row["cut"] > 0 and row["duration_s"] > 0:
        return float(row["completed"]) / float(row["duration_s"])
    return float(row["rate"])


def point_table(summary: pd.DataFrame, P: dict, parts: list[str] | None = None) -> pd.DataFrame:
    """Per point of ``P``'s plan (restricted to ``parts``): the window, its seconds (with a second attempt where
    the first would fall short) and expected completed requests, from a committed run's ``summary``. A point that
    run did not measure takes the same model's ChunkedPrefill point at the nearest budget and the same fraction."""
    ok = summary[summary["status"] == "ok"]
    rows = []
    for model in P["models"]:
        m = ok[ok["model"] == model]
        cap = (P.get("capacities") or {}).get(model)
        for pt in plan_points({**P, "parts": parts}, model):
            same = m[(m["scheduler"] == pt.scheduler) & (m["rate_fraction"] == pt.rate_fraction)]
            if same.empty:
                same = m[(m["scheduler"] == "chunked_prefill") & (m["rate_fraction"] == pt.rate_fraction)]
            if same.empty:
                continue
            r = same.iloc[(same["budget"] - pt.budget).abs().argsort()[:1]].iloc[0]
            rate = pt.rate_fraction * cap if cap else float(r["rate"])
            served = min(rate, _served(r)) if r["cut"] > 0 else rate  # saturated: what it completed
            first = window_s(P, rate, cap)
            final = window_s(P, rate, served)
            expected = min(rate * first, served * (first + P["drain_s"]))
            retry = expected < P["min_requests"] and final > first + 1.0
            seconds = point_cost_s(P, final) + (point_cost_s(P, first) if retry else 0.0)
            rows.append(
                {
                    "model": model,
                    "scheduler": pt.scheduler,
                    "budget": pt.budget,
                    "rate_fraction": pt.rate_fraction,
                    "sweep": pt.sweep,
                    "rate": rate,
                    "served_req_s": served,
                    "window_s": final,
                    "retry": retry,
                    "point_s": seconds,
                    "expected_completed": min(rate * final, served * (final + P["drain_s"])),
                    "misses_slo": bool(r["itl_p99_ms"] > r["slo_itl_ms"] or r["cut"] > 0),
                }
            )
    return pd.DataFrame(rows)


def search_s(points: pd.DataFrame, P: dict) -> float:
    """The expected seconds of the capacity search over ``points`` (``point_table``'s rows of one part)."""
    total = 0.0
    fr = sorted(P["rate_fractions"])
    for _, g in points[points["sweep"] == "rate"].groupby(["model", "scheduler", "budget"]):
        low, high = g[g["rate_fraction"] == fr[0]], g[g["rate_fraction"] == fr[-1]]
        if len(low) and low["misses_slo"].iloc[0]:
            rate = float(low["rate"].iloc[0])
            for k in range(1, min(SEARCH_GUESS, P["search_steps"]) + 1):
                r = rate / P["search_factor"] ** k
                total += point_cost_s(P, window_s({**P, "min_requests": P["search_min_requests"]}, r, None))
        if len(high) and not high["misses_slo"].iloc[0] and P["search_steps"]:
            r = float(high["rate"].iloc[0]) * P["search_factor"]
            total += point_cost_s(P, window_s({**P, "min_requests": P["search_min_requests"]}, r, r / 2))
    return total


def part_seconds(summary: pd.DataFrame, servers: pd.DataFrame, P: dict, parts: list[str]) -> dict:
    """One part's expected seconds on the H200: ceilings, each model's server start and probe, its points (with
    second attempts) and its capacity search; the sums by kind."""
    pts = point_table(summary, P, parts)
    load = dict(zip(servers["model"], servers["load_s"], strict=True)) if "load_s" in servers else {}
    models = list(dict.fromkeys(pts["model"])) if len(pts) else []
    start = CEILINGS_S + sum(float(load.get(m, 30.0)) + PROBE_S for m in models)
    points_s = float(pts["point_s"].sum()) if len(pts) else 0.0
    search = search_s(pts, P) if len(pts) else 0.0
    return {
        "points": len(pts),
        "start_s": start,
        "points_s": points_s,
        "search_s": search,
        "total_s": start + points_s + search,
        "min_expected_completed": float(pts["expected_completed"].min()) if len(pts) else float("nan"),
    }


def main(folder: str = LEGACY) -> None:
    """Print every part's expected minutes from the committed run in ``folder``."""
    from servelab.paths import REPO_ROOT
    from servelab.studies.s01_scheduling.measure import PART_SELECTORS, PARTS
    from servelab.studies.s01_scheduling.params import study_params

    P = study_params("full")
    d = REPO_ROOT / folder
    summary, servers = pd.read_csv(d / "summary.csv"), pd.read_csv(d / "servers.csv")
    for name, sel in PART_SELECTORS.items():
        e = part_seconds(summary, servers, P, sel)
        print(
            f"{name:<22} {e['total_s'] / 60:4.1f} min (PARTS: {PARTS[name]}) = start {e['start_s']:.0f} s + "
            f"{e['points']} points {e['points_s']:.0f} s + search {e['search_s']:.0f} s; "
            f"fewest expected completed {e['min_expected_completed']:.0f}"
        )
    print(" ", ", ".join(short(m) for m in P["models"]))


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:])
