"""Study 2: what prefill and decode cost on this GPU, against the roofline, and a fitted cost model."""

from servelab.costs.sweep import StepPoint, step_sweep, prefill_points, decode_points
from servelab.costs.cost_model import CostModel

__all__ = ["StepPoint", "step_sweep", "prefill_points", "decode_points", "CostModel"]
