"""A row of ``bench.csv``: a measured value beside its bound and the goal it is held to (issue 19's table)."""

from __future__ import annotations

GOALS = {
    "decode_ms_b1_ctx128": ("<=", 0.6),
    "decode_ms_b64_ctx512": ("<=", 0.8),
    "decode_ms_b1_ctx16384": ("<=", 1.0),
    "offline_tok_s": (">=", 60000),
    "offline_budget512_ratio": (">=", 0.85),
    "engine_speedup_vs_hf": (">=", 20),
    "prefill_mfu_4096": (">=", 0.6),
    "e2e_over_forward_b1": ("<=", 1.3),
}
TIME_UNITS = ("ms", "ms/token")  # a bound on a time is a floor: pct_of_roofline = bound / value


def bench_row(metric: str, value, unit: str, bound=None, note: str = "", low=None, high=None) -> dict:
    """A bench row; ``pct_of_roofline`` is 100 at the bound (floor/measured for times, measured/bound for rates).
    ``low``, ``high``: the value's spread where it has one (a decode step's quartiles, the offline runs' range),
    so that a switch row is read against the default's spread, not its value alone."""
    if bound is None or value is None or value != value:
        pct = float("nan")
    elif unit in TIME_UNITS:
        pct = 100.0 * bound / value
    else:
        pct = 100.0 * value / bound
    op, goal = GOALS.get(metric, (None, float("nan")))
    meets = None if op is None or value != value else (value <= goal if op == "<=" else value >= goal)
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "roofline_bound": bound,
        "pct_of_roofline": pct,
        "goal": f"{op} {goal:g}" if op else "",
        "meets_goal": meets,
        "note": note,
        "low": float("nan") if low is None else low,
        "high": float("nan") if high is None else high,
    }


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is missing (NaN) or ``b`` is 0."""
    return a / b if a == a and b == b and b else float("nan")
