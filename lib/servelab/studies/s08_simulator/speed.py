"""How fast the simulator runs: simulated requests per second of wall time on one core.

Issue 7's goal: one hour of traffic at 100 req/s over 8 replicas in at most 60 s. ``simulator_speed``
simulates ``duration_s`` of such traffic (the event loop is single-threaded Python) and reports what it took;
when ``duration_s`` is shorter than an hour the hour's time is extrapolated linearly from the measured rate
(the load is stationary, so the cost per request is too), and the row says so.
"""

from __future__ import annotations

import time

from servelab.errors import ParameterError
from servelab.loadgen.workload import Trace
from servelab.sim.cost_model import StepCostModel
from servelab.sim.simulator import simulate

GOAL_S = 60.0  # wall seconds allowed for one simulated hour (issue 7)
HOUR_S = 3600.0


def simulator_speed(
    lengths,
    *,
    cost: StepCostModel,
    rate: float = 100.0,
    duration_s: float = 3600.0,
    replicas: int = 8,
    router: str = "least_outstanding",
    seed: int = 0,
    progress: bool = False,
    **sim_kwargs,
) -> dict:
    """One row: the traffic simulated, wall and CPU seconds, simulated requests per wall second, and the
    (measured or extrapolated) wall time of one simulated hour against the 60 s goal."""
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not 0 < duration_s <= HOUR_S:
        raise ParameterError(f"duration_s must be in (0, {HOUR_S:g}] seconds, got {duration_s!r}")
    trace = Trace.synthetic(rate=rate, lengths=lengths, duration_s=duration_s, seed=seed, max_requests=10_000_000)
    cpu0 = time.process_time()
    run = simulate(
        trace, cost=cost, replicas=replicas, router=router, token_times=False, progress=progress, **sim_kwargs
    )
    cpu = time.process_time() - cpu0
    s = run.summary()
    per_s = len(trace) / run.wall_s
    hour_s = run.wall_s * HOUR_S / duration_s
    return {
        "rate": rate,
        "replicas": replicas,
        "router": router,
        "scheduler": run.params["scheduler"],
        "simulated_s": duration_s,
        "requests": len(trace),
        "steps": run.num_steps,
        "wall_s": run.wall_s,
        "cpu_s": cpu,
        "sim_requests_per_s": per_s,
        "sim_steps_per_s": run.num_steps / run.wall_s,
        "hour_wall_s": hour_s,
        "hour_extrapolated": duration_s < HOUR_S,
        "goal_s": GOAL_S,
        "meets_goal": hour_s <= GOAL_S,
        "completed": s["completed"],
        "ttft_p99_ms": s["ttft_p99_ms"],
        "lengths": lengths.source,
    }
