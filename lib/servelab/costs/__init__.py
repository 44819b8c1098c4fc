"""Study 2: what prefill, decode and mixed steps cost on this GPU, against the roofline, and a fitted cost model."""

from servelab.costs.points import StepPoint, context_prefill_points, decode_points, mixed_points, prefill_points
from servelab.costs.sweep import step_sweep
from servelab.costs.cost_model import CostModel

__all__ = ["StepPoint", "step_sweep", "prefill_points", "decode_points", "context_prefill_points", "mixed_points",
           "CostModel"]
