"""A step-cost model small enough to reason about, shared by the simulator's capacity tests: prefill 3 ms + 0.01
ms a token, decode 2 ms + 0.02 ms a sequence, no attention terms."""

from servelab.sim import StepCostModel
from servelab.sim.cost_model import CostModel

COST = StepCostModel(
    gpu=CostModel(
        "m",
        "test",
        {"intercept_ms": 3.0, "ms_per_token": 0.01, "ms_per_attn_pair": 0.0},
        {"intercept_ms": 2.0, "ms_per_seq": 0.02, "ms_per_ctx_token": 0.0},
        {},
    )
)
