"""A discrete-event simulator of LLM serving: the engine's own schedulers on a measured cost model.

- ``cost_fit.py``: ``CostModel``, a step time fitted from Study 2's measured steps;
- ``cost_model.py``: ``StepCostModel``, step time from batch composition (those GPU terms + serving overheads);
- ``calibration.py``: the serving overheads (and, for an unmeasured model, the whole cost model) fitted from
  a real server's step log;
- ``replica.py``: one simulated server, a real ``Scheduler`` whose steps take the cost model's time;
- ``decode_run.py``: the fast path, runs of decode-only steps (finishes included) booked at once;
- ``routers.py``: round-robin, least-outstanding and prefix-affinity routing over replicas;
- ``simulator.py``: the event loop, ``simulate(trace, ...) -> SimRun`` (records in the load generator's schema,
  summarized by the load generator's own ``servelab.loadgen.metrics``); ``records.py``: what it books per request;
- ``engine_replay.py``: the real engine driven in-process by a trace (the reference on a CPU);
- ``capacity.py``: replicas needed against request rate at an SLO; ``prefix_workload.py``: prompts that share
  prefixes;
- ``__main__.py``: ``python -m servelab.sim``, the load generator's workload flags and report.

Study 8 (the simulator's validation against Studies 1 and 7, its speed) is ``servelab.studies.s08_simulator``.
"""

from servelab.sim.cost_model import StepCostModel
from servelab.sim.routers import ROUTERS, make_router
from servelab.sim.simulator import SimRun, simulate

__all__ = ["StepCostModel", "SimRun", "simulate", "ROUTERS", "make_router"]
