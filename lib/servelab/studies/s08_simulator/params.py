"""The simulator study's measuring parameters: profile defaults, overrides from papermill, validation.

The measuring path (``measure.py``) does two things a CPU at render time cannot:

- ``fresh_*`` parts: a fresh held-out run of the real server (Study 1's sweep, ``servelab.studies.s01_scheduling``)
  with the seed and rate fractions of the registered spec ``data/validation/<fresh_run>.yaml`` (none of them used in
  calibration; the seed moved by this run's ``seed`` so that repeats differ), one part per model, after recording
  the cost-model code's hash against the freeze (``freeze.py``);
- ``speed``: the wall time of ``speed_duration_s`` simulated seconds at ``speed_rate`` req/s over ``speed_replicas``
  replicas on the run's host (the goal: one hour in at most 60 s), on the frozen cost model.

``full`` runs Study 1's full profile on the GPU; ``smoke`` its smoke profile on the CPU (tiny model) and ten
simulated seconds of the speed traffic. The page's simulations (capacity, routing) are the report's
(``report.SETTINGS``), recomputed at every render.
"""

from __future__ import annotations

from servelab.studies.common.params import ParameterError, resolve

DEFAULTS = {
    "full": dict(
        fresh_run="fresh_run_5",
        fresh_models=None,  # None: the part's model (fresh_<model>), or every model of Study 1's profile (part all)
        fresh_time_budget_s=330.0,  # Study 1's own budget for one part's points (those left are recorded skipped)
        speed_rate=100.0,
        speed_replicas=8,
        speed_duration_s=3600.0,
        seed=0,
    ),
    "smoke": dict(
        fresh_run="fresh_run_5",
        fresh_models=None,
        fresh_time_budget_s=60.0,
        speed_rate=100.0,
        speed_replicas=8,
        speed_duration_s=10.0,
        seed=0,
    ),
}


def _positive(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ParameterError(f"{name} must be a positive number, got {v!r}")
    return float(v)


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply the non-None overrides, validate (``ParameterError`` names the culprit)."""
    p = resolve(DEFAULTS, profile, overrides)
    if not isinstance(p["fresh_run"], str) or not p["fresh_run"]:
        raise ParameterError(f"fresh_run must name a spec under data/validation/, got {p['fresh_run']!r}")
    fm = p["fresh_models"]
    if fm is not None and (not isinstance(fm, (list, tuple)) or not all(isinstance(m, str) and m for m in fm)):
        raise ParameterError(f"fresh_models must be a list of model specs, got {fm!r}")
    for k in ("fresh_time_budget_s", "speed_rate", "speed_duration_s"):
        p[k] = _positive(k, p[k])
    if p["speed_duration_s"] > 3600:
        raise ParameterError(f"speed_duration_s must be at most 3600 (one hour), got {p['speed_duration_s']}")
    if isinstance(p["speed_replicas"], bool) or not isinstance(p["speed_replicas"], int) or p["speed_replicas"] < 1:
        raise ParameterError(f"speed_replicas must be a positive integer, got {p['speed_replicas']!r}")
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise ParameterError(f"seed must be an integer, got {p['seed']!r}")
    return p
