"""How long each load point offers load, which points a run measures (``parts``), and what the full profile costs.

A point is sized to complete ``min_requests`` requests: it offers arrivals for ``window_s = min(point_cap_s,
min_requests × (1 + ARRIVAL_SLACK) / served)`` seconds, with ``served`` (req/s) the rate it can complete: the
offered rate, or less where the policy saturates (the probe's capacity estimate for the model, replaced by a policy
setting's own completion rate once one of its points saturated). A point capped by ``point_cap_s`` may complete
fewer; ``sweep.run_point`` records the ``shortfall`` (``min_requests`` − completed, at least 0), never hides it.

The full profile holds more GPU time than one run: ``parts`` selects the points of one run, by model
(``"llama-3-8b"``) or by model and policy setting (``"llama-3-8b/fcfs"``, ``"llama-3-8b/chunked_prefill@512"``,
``"llama-3-8b/budget"`` for the budget sweep's extra budgets). ``gpu_time_table`` estimates each point's seconds from
a committed run's completion rates, and ``plan_parts`` groups them into runs that fit a time budget.
"""

from __future__ import annotations

import math

import pandas as pd

from servelab.errors import ParameterError

ARRIVAL_SLACK = 0.15  # extra arrivals beyond min_requests: requests cut at the deadline, a capacity estimate too high
POINT_OVERHEAD_S = 0.7  # per point: trace file, worker round trip, idle wait, step-log read
MODEL_LOAD_GUESS_S = 12.0  # a model load + CUDA-graph capture, for planning only
ENGINE_PROCESS_START_GUESS_S = 8.0  # the engine process's fresh interpreter and its imports, for planning only
BUDGET = "budget"  # the selector of the budget sweep's extra points


def short(model: str) -> str:
    return model.split(":")[-1]


def setting(scheduler: str, budget: int) -> str:
    """A policy setting's name in selectors: ``chunked_prefill@512``; whole-prompt policies by name alone."""
    return f"{scheduler}@{int(budget)}" if scheduler == "chunked_prefill" else scheduler


def window_s(P: dict, rate: float, served_req_s: float | None) -> float:
    """Seconds of arrivals (s) for a point at ``rate`` req/s that completes ``served_req_s`` req/s at most (None:
    as many as arrive), so that ``min_requests`` complete, capped at ``point_cap_s``."""
    if not rate > 0:
        raise ParameterError(f"rate must be a positive number of req/s, got {rate!r}")
    served = rate if served_req_s is None or not served_req_s > 0 else min(rate, served_req_s)
    return min(P["point_cap_s"], P["min_requests"] * (1 + ARRIVAL_SLACK) / served)


def arrivals(rate: float, window: float) -> int:
    """Requests offered in ``window`` seconds at ``rate`` req/s (at least one)."""
    return max(1, math.ceil(rate * window))


def max_arrivals(P: dict, rate: float) -> int:
    """The longest trace a point at ``rate`` can replay: ``point_cap_s`` of arrivals. Every point of one rate replays
    a prefix of it, so that all policies see the same requests in the same order."""
    return arrivals(rate, P["point_cap_s"])


def point_cost_s(P: dict, window: float) -> float:
    return window + P["drain_s"] + POINT_OVERHEAD_S


def load_guess_s(P: dict) -> float:
    """Seconds to plan for starting one model's server (model load, graphs, and the engine process's start)."""
    return MODEL_LOAD_GUESS_S + (ENGINE_PROCESS_START_GUESS_S if P.get("engine_process", True) else 0.0)


# ---- parts ----------------------------------------------------------------------------------------------------------


def _settings(P: dict, model: str) -> list[str]:
    out = [setting(n, b) for n, b in P["policies"]]
    return out + ([BUDGET] if P["budget_sweep"] and model == P["budget_sweep_model"] else [])


def check_selectors(parts, P: dict) -> list[str]:
    """``parts`` as a list of selectors (a comma-separated string is split), each naming a model of ``P`` and, after
    a ``/``, one of its policy settings or ``budget``; ``ParameterError`` otherwise."""
    if isinstance(parts, str):
        parts = [x.strip() for x in parts.split(",") if x.strip()]
    if not isinstance(parts, (list, tuple)) or not parts or not all(isinstance(x, str) for x in parts):
        raise ParameterError(f"parts must be None or a non-empty list of selectors, got {parts!r}")
    models = {short(m): m for m in P["models"]}
    for sel in parts:
        name, _, what = sel.partition("/")
        if name not in models:
            raise ParameterError(f"parts: {sel!r} names no model of this run (models: {', '.join(models)})")
        if what and what not in _settings(P, models[name]):
            raise ParameterError(
                f"parts: {sel!r}: {what!r} is not a setting of {name} ({', '.join(_settings(P, models[name]))})"
            )
    return list(parts)


def selected(parts: list[str] | None, model: str, scheduler: str, budget: int, sweep: str) -> bool:
    """Whether a point belongs to the run's ``parts`` (None: every point)."""
    if parts is None:
        return True
    what = BUDGET if sweep == "budget" else setting(scheduler, budget)
    return any(sel in (short(model), f"{short(model)}/{what}") for sel in parts)


def label(parts: list[str] | None) -> str:
    """A folder name for a run of ``parts``: ``llama-3-8b_fcfs+llama-3-8b_budget``."""
    if parts is None:
        return "all"
    return "+".join(p.replace("/", "_").replace("@", "-") for p in parts)


# ---- the full profile's GPU time ---------------------------------------------------------------------------------


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
    from servelab.studies.s01_scheduling.sweep import plan_points

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


def capacities(spec) -> dict[str, float]:
    """``P['capacities']`` as req/s per model spec: {} for None; a dict as given; a results folder (absolute, or
    relative to the working directory or the repository) read from its ``probes.csv`` (the rows whose probe ran)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return dict(spec)
    from pathlib import Path

    from servelab.paths import DATA_DIR

    folder = next((p for p in (Path(spec), DATA_DIR.parent / spec) if (p / "probes.csv").is_file()), None)
    if folder is None:
        raise ParameterError(f"capacities: no probes.csv in {spec!r} (nor under {DATA_DIR.parent})")
    probes = pd.read_csv(folder / "probes.csv")
    probes = probes[(probes["status"] == "ok") & probes["capacity_req_s"].notna()]
    return {str(m): float(c) for m, c in zip(probes["model"], probes["capacity_req_s"], strict=True)}


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
