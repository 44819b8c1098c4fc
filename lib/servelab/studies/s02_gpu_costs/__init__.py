"""Study 2: what prefill, decode and mixed steps cost on this GPU, against the roofline, and a fitted cost model.

- ``points.py``: the steps timed and their FLOPs and bytes; ``sweep.py``: timed steps in each execution mode;
- ``launch_overhead.py``: what CUDA graphs save; ``run.py``: the study; ``params.py``: its profiles;
- ``verdicts.py``: F2.1–F2.3; ``report.py``: the page's takeaways; ``plots.py``: the figures.

The fitted cost model itself (``CostModel``) is the simulator's: ``servelab.sim.cost_fit``.
"""

from servelab.sim.cost_fit import CostModel
from servelab.studies.s02_gpu_costs.points import (
    StepPoint,
    context_prefill_points,
    decode_points,
    mixed_points,
    prefill_points,
)
from servelab.studies.s02_gpu_costs.sweep import step_sweep

__all__ = [
    "StepPoint",
    "step_sweep",
    "prefill_points",
    "decode_points",
    "context_prefill_points",
    "mixed_points",
    "CostModel",
]
