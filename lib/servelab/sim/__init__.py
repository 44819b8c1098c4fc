"""A discrete-event simulator of LLM serving: the engine's own schedulers on a measured cost model.

- ``cost_model.py``: ``StepCostModel``, step time from batch composition (Study 2's GPU fit + serving overheads);
- ``context_reads.py``: what a step pays to read cached context, its longest walk over keys (a prefill chunk's
  or a decode's), from Study 2's steps;
- ``calibration.py``: the serving overheads (and, for an unmeasured model, the whole cost model) fitted from
  a real server's step log;
- ``replica.py``: one simulated server, a real ``Scheduler`` whose steps take the cost model's time;
- ``decode_run.py``: the fast path, runs of decode-only steps (finishes included) booked at once;
- ``routers.py``: round-robin, least-outstanding and prefix-affinity routing over replicas;
- ``simulator.py``: the event loop, ``simulate(trace, ...) -> SimRun`` (records in the load generator's schema);
- ``validation.py``: real-vs-simulated tables for Study 1's runs (``study1_runs.py`` loads them,
  ``ablation.py`` repeats the table with each GPU term left out); ``study7_runs.py``: Study 7's server runs
  replayed with the prefix cache;
- ``prefix_routing.py``: routers over replicas that keep prefix caches;
- ``capacity.py``: replicas needed against request rate at an SLO;
- ``speed.py``: how many simulated requests per second the simulator handles;
- ``plots.py``: the figures of notebook 08; ``__main__.py``: the command line.
"""

from servelab.sim.cost_model import StepCostModel
from servelab.sim.routers import ROUTERS, make_router
from servelab.sim.simulator import SimRun, simulate

__all__ = ["StepCostModel", "SimRun", "simulate", "ROUTERS", "make_router"]
