"""Study 2: what prefill, decode and mixed steps cost on this GPU, against the roofline, and a fitted cost model."""

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
