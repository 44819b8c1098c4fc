"""The draft's decode steps of a round in one CUDA graph (issue 30: "the draft's γ steps run in one captured graph
per round").

Why: on the H100 a γ = 4 round of the 0.5B-shape draft took 3.60 ms, of which 0.68 ms the GPU sat idle, across 3.9
graph launches a round (``data/dev/nvidia-h100/2026-12-06/spec_engine_staged_cde4f98.budget.csv``): between two of
a round's decode steps the host built the next step's inputs (rows, slots, a packed copy) and replayed the next
graph. Every input of those steps is known when the round starts (each row's positions and reserved slots), and
each step's tokens are the argmax of the step before, so the whole chain fits one graph: the inputs of all
``steps`` go over in one copy, and the graph feeds each step's tokens to the next on the device.

Measured (``spec_engine_rounds_*_{01a6b16,3f5a130}``, H100, two processes each): two launches a round instead of
3.9, but not less time (3.605 and 3.817 against 3.641 and 3.672 ms at batch 1, 5.14 and 5.08 against 5.00 and 5.02
at batch 8): the idle time lies between the round's kernels inside the graphs, not on the host between them. What
cuts it is fewer kernels (``models.small_batch``). So the speculative mode captures it only when asked
(``SpeculativeEngine(round_graph=True)``); the step-by-step rounds stay the default.

A round graph of ``steps`` decode steps per (batch, block-width) bucket, as ``DecodeGraphs`` buckets one step (it
is one, with a longer forward): per step, that step's inputs from the staged ``[steps, 5, B]``, the token ids
from the step before (``first`` for the first), the model's forward and the argmax. A row that drafts fewer
tokens, or none, sits out the steps past its count as a padding row (its K/V into the scratch block). Greedy drafts
only: a sampled draft draws from its request's generator, whose offsets a graph replay would not advance; such a
round takes the step-by-step path (``DraftModel.propose``). Uncaptured (a CPU) the same forward runs eagerly.
"""

from __future__ import annotations

import torch

from servelab.engine.cuda_graphs import IDS, DecodeGraphs
from servelab.errors import ParameterError


class RoundGraphs(DecodeGraphs):
    """``steps`` chained greedy decode steps per bucket; ``run`` replays one for a round."""

    def __init__(self, model, pool, tables, *, steps: int, **buckets):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ParameterError(f"a round graph chains 1 or more decode steps, got {steps!r}")
        super().__init__(model, pool, tables, **buckets)
        self.steps = steps
        B = self.batch_sizes[-1]
        self.staged = self.padding[None, :, None].repeat(steps, 1, B).to(pool.device)  # [steps, 5, B]
        self.first = torch.zeros(B, dtype=torch.long, device=pool.device)

    def _forward(self, b: int, w: int) -> torch.Tensor:
        x, prev, out = self.inputs[:, :b], self.first[:b], []
        for j in range(self.steps):
            x.copy_(self.staged[j, :, :b])
            x[IDS].copy_(prev)
            prev = super()._forward(b, w).argmax(dim=-1)  # the draft's greedy draw (DraftModel._draw)
            out.append(prev)
        return torch.stack(out)  # [steps, b]

    def run(self, first: torch.Tensor, plan: list[list[tuple[int, int, int] | None]]) -> torch.Tensor | None:
        """Tokens ``[steps, b]`` on the device for a round of ``b = len(first)`` rows: ``first`` (on the device) are
        the tokens the first step reads, ``plan[j][i]`` row i's ``(position, slot, table row)`` at step j, or None
        where it sits out. None when no captured bucket holds the round."""
        if len(plan) != self.steps:
            raise ParameterError(f"this round graph chains {self.steps} steps, the plan has {len(plan)}")
        b = len(first)
        live = [e[0] for step in plan for e in step if e is not None]
        key = self.bucket(b, (max(live) if live else 0) // self.pool.block_size + 1)
        if key is None or (self.graphs and key not in self.graphs):
            return None
        B, pad = key[0], self.padding.tolist()
        cols = [[pad if e is None else (0, e[0], e[1], e[0] + 1, e[2]) for e in s] + [pad] * (B - b) for s in plan]
        host = torch.tensor(cols, dtype=torch.long).transpose(1, 2)  # [steps, 5, B], built from lists in one go
        self.staged[:, :, :B].copy_(host.to(self.staged.device, non_blocking=True))
        self.first[:b].copy_(first)
        return self.forward(key)[:, :b]
