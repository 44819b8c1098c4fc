"""How long each load point offers load, which points a run measures (``parts``), and what the full profile costs.

A point is sized to complete ``min_requests`` requests: it offers arrivals for ``window_s = min(point_cap_s,
min_requests × (1 + ARRIVAL_SLACK) / served)`` seconds, with ``served`` (req/s) the rate it can complete: the
offered rate, or the model's capacity where that is lower. The window is the same for every policy at one rate, so
that they replay the same requests; a policy that saturates there and falls short runs the point again, sized by its
own completion rate (``sweep._measure_point``). A point capped by ``point_cap_s`` may complete fewer;
``sweep.run_point`` records the ``shortfall`` (``min_requests`` − completed, at least 0), never hides it.

The full profile holds more GPU time than one run: ``parts`` selects the points of one run, by model
(``"llama-3-8b"``), by model and policy setting (``"llama-3-8b/fcfs"``, ``"llama-3-8b/chunked_prefill@512"``,
``"llama-3-8b/budget"`` for the budget sweep's extra budgets), or by model, setting and rate fraction
(``"llama-3-8b/fcfs/0.3"``); ``measure.PART_SELECTORS`` names the full profile's parts, ``gpu_time`` estimates them.
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
    if P["budget_sweep"] and model == P["budget_sweep_model"]:
        out += [BUDGET, *(f"{BUDGET}@{b}" for b in P["budget_sweep"])]
    return out


def check_selectors(parts, P: dict) -> list[str]:
    """``parts`` as a list of selectors (a comma-separated string is split), each naming a model of ``P`` and, after
    a ``/``, one of its policy settings or ``budget``; ``ParameterError`` otherwise."""
    if isinstance(parts, str):
        parts = [x.strip() for x in parts.split(",") if x.strip()]
    if not isinstance(parts, (list, tuple)) or not parts or not all(isinstance(x, str) for x in parts):
        raise ParameterError(f"parts must be None or a non-empty list of selectors, got {parts!r}")
    models = {short(m): m for m in P["models"]}
    for sel in parts:
        name, _, rest = sel.partition("/")
        what, _, fraction = rest.partition("/")
        if name not in models:
            raise ParameterError(f"parts: {sel!r} names no model of this run (models: {', '.join(models)})")
        if what and what not in _settings(P, models[name]):
            raise ParameterError(
                f"parts: {sel!r}: {what!r} is not a setting of {name} ({', '.join(_settings(P, models[name]))})"
            )
        if fraction and fraction not in {f"{f:g}" for f in P["rate_fractions"]}:
            raise ParameterError(f"parts: {sel!r}: {fraction!r} is not one of rate_fractions {P['rate_fractions']}")
    return list(parts)


def selected(
    parts: list[str] | None, model: str, scheduler: str, budget: int, sweep: str, rate_fraction: float | None = None
) -> bool:
    """Whether a point belongs to the run's ``parts`` (None: every point)."""
    if parts is None:
        return True
    what = BUDGET if sweep == "budget" else setting(scheduler, budget)
    names = {short(model), f"{short(model)}/{what}"}
    if rate_fraction is not None:
        names.add(f"{short(model)}/{what}/{rate_fraction:g}")
    if sweep == "budget":
        names.add(f"{short(model)}/{BUDGET}@{int(budget)}")
    return any(sel in names for sel in parts)


def label(parts: list[str] | None) -> str:
    """A folder name for a run of ``parts``: ``llama-3-8b_fcfs+llama-3-8b_budget``."""
    if parts is None:
        return "all"
    return "+".join(p.replace("/", "_").replace("@", "-") for p in parts)


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
