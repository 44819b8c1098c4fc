"""Decode steps captured as CUDA graphs, one per (batch, blocks) bucket, replayed with fresh inputs.

A decode step of a small model is a few hundred short kernels; launched from Python each costs
microseconds of CPU time, far more than the GPU needs to run it. A graph launches them all at once.
Graph shapes are fixed, so a step of ``b`` sequences whose longest needs ``n`` blocks runs in the
smallest captured bucket ``(B >= b, NB >= n)``; the ``B - b`` padding rows write their K/V into a
scratch block that no sequence owns and attend to it alone, so they cost time but change nothing.
Which block widths get their own graphs depends on the attention backend: the gather backend's cost
grows with the width, so widths are bucketed by powers of two; a paged kernel that reads only each
sequence's real length needs one width.

A step's inputs travel in one host-to-device copy: token ids, positions, slots, context lengths and
each sequence's row in the device block table (``DeviceBlockTables``), which the graph gathers itself.
"""

from __future__ import annotations

import bisect

import torch

from servelab.engine.block_tables import DeviceBlockTables
from servelab.kernels.attention import AttentionMetadata

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
IDS, POSITIONS, SLOTS, CONTEXT_LENS, TABLE_ROWS = range(5)


def capture_graph(forward, memory_pool):
    """``(graph, output)``: ``forward()`` run once eagerly (lazy initialisation, Triton compiles and cuBLAS's
    kernel choice happen outside the capture), then captured into ``memory_pool``."""
    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=memory_pool):
        out = forward()
    return graph, out


def power_of_two_buckets(maximum: int, smallest: int = 1) -> list[int]:
    """``smallest, 2·smallest, 4·smallest, …`` up to and including ``maximum``."""
    out, b = [], smallest
    while b < maximum:
        out.append(b)
        b *= 2
    return out + [maximum]


class DecodeGraphs:
    """Captured decode steps of ``model`` on ``pool``; ``run(...)`` replays the right bucket."""

    def __init__(
        self,
        model,
        pool,
        tables: DeviceBlockTables,
        *,
        max_batch: int,
        scratch_block: int,
        block_widths: list[int] | None = None,
        batch_sizes=None,
    ):
        """Nothing is captured until ``capture()``; uncaptured, ``forward`` runs the same step eagerly."""
        self.model, self.pool, self.tables = model, pool, tables
        # explicit sizes are captured as given; by default powers of two up to max_batch, and max_batch
        self.batch_sizes = (
            sorted(set(batch_sizes))
            if batch_sizes is not None
            else sorted({b for b in GRAPH_BATCH_SIZES if b < max_batch} | {max_batch})
        )
        self.block_widths = sorted(block_widths or [tables.max_blocks])
        self.scratch_slot = scratch_block * pool.block_size
        B = self.batch_sizes[-1]
        self.padding = torch.tensor([0, 0, self.scratch_slot, 1, tables.pad_row], dtype=torch.long)
        self.inputs = self.padding[:, None].repeat(1, B).to(pool.device)  # [5, B]
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.memory_pool = None

    def _forward(self, b: int, w: int):
        x = self.inputs[:, :b]
        tables = self.tables.device_table[:, :w][x[TABLE_ROWS]]  # gathered inside the graph
        meta = AttentionMetadata(
            slot_mapping=x[SLOTS], num_decode_tokens=b, decode_context_lens=x[CONTEXT_LENS], decode_block_tables=tables
        )
        return self.model(x[IDS], x[POSITIONS], meta, self.pool)

    @torch.inference_mode()
    def capture(self, progress=None) -> None:
        """Capture every bucket, largest first so that smaller graphs reuse the largest one's memory."""
        self.memory_pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.batch_sizes):
            for w in reversed(self.block_widths):
                self.graphs[(b, w)] = capture_graph(lambda b=b, w=w: self._forward(b, w), self.memory_pool)
                if progress is not None:
                    progress.update(1)
        torch.cuda.synchronize()

    @property
    def num_graphs(self) -> int:
        return len(self.batch_sizes) * len(self.block_widths)

    def bucket(self, batch: int, blocks: int) -> tuple[int, int] | None:
        """The smallest captured ``(B, NB)`` that holds the step, or None if it is larger than all."""
        i = bisect.bisect_left(self.batch_sizes, batch)
        j = bisect.bisect_left(self.block_widths, blocks)
        if i == len(self.batch_sizes) or j == len(self.block_widths):
            return None
        return self.batch_sizes[i], self.block_widths[j]

    def load(self, host: torch.Tensor) -> None:
        """Copy a step's packed inputs ``[5, B]`` (ids, positions, slots, context lengths, table rows) in."""
        self.inputs[:, : host.shape[1]].copy_(host, non_blocking=True)

    def forward(self, key: tuple[int, int]) -> torch.Tensor:
        """Run bucket ``key`` on the loaded inputs: a graph replay, or (uncaptured, e.g. on a CPU) the same forward."""
        if key in self.graphs:
            graph, out = self.graphs[key]
            graph.replay()
            return out
        with torch.inference_mode():
            return self._forward(*key)

    def pack(self, ids, positions, slots, table_rows, batch: int) -> torch.Tensor:
        """Host tensor ``[5, batch]``: the step's inputs followed by padding rows."""
        b = len(ids)
        host = self.padding[:, None].repeat(1, batch)
        host[:, :b] = torch.tensor([ids, positions, slots, [p + 1 for p in positions], table_rows], dtype=torch.long)
        return host

    def run(
        self, ids: list[int], positions: list[int], slots: list[int], table_rows: list[int], patch=None
    ) -> torch.Tensor | None:
        """Replay for ``len(ids)`` decode tokens; logits ``[len(ids), vocab]`` (a view of the graph's output).

        ``positions[i]`` is the new token's position, so it attends to ``positions[i] + 1`` keys. ``patch(ids)``,
        if given, edits the loaded token ids on the device before the replay (tokens not read back yet).
        """
        b = len(ids)
        key = self.bucket(b, max(positions) // self.pool.block_size + 1)
        if key is None or (self.graphs and key not in self.graphs):  # uncaptured (a CPU): the same step, eagerly
            return None
        self.load(self.pack(ids, positions, slots, table_rows, key[0]))
        if patch is not None:
            patch(self.inputs[IDS, :b])
        return self.forward(key)[:b]

    def run_steps(
        self, first_ids: list[int], steps: list[list[tuple[int, int, int]]], sample_fn
    ) -> torch.Tensor | None:
        """``K = len(steps)`` decode steps back to back, each feeding its sampled tokens to the next on the device.

        ``steps[j][i] = (position, slot, table_row)`` of sequence i at step j, or None where it sits out (it
        becomes a padding row). ``sample_fn(logits [b, vocab]) -> tokens [b]`` runs on the device. Returns
        the tokens ``[K, b]`` (on the device; one copy to the host ends the whole group).
        """
        b, k = len(first_ids), len(steps)
        need = max(e[0] for step in steps for e in step if e is not None) // self.pool.block_size + 1
        key = self.bucket(b, need)
        if key is None or (self.graphs and key not in self.graphs):
            return None
        B = key[0]
        pad = self.padding.tolist()
        rows = []  # built as lists and converted once: per-element tensor writes would cost milliseconds
        for step in steps:
            cols = [pad if e is None else (0, e[0], e[1], e[0] + 1, e[2]) for e in step] + [pad] * (B - b)
            rows.append(list(zip(*cols, strict=True)))
        host = torch.tensor(rows, dtype=torch.long)  # [K, 5, B]
        host[0, 0, :b] = torch.tensor(first_ids, dtype=torch.long)
        staged = host.to(self.inputs.device, non_blocking=True)
        tokens = []
        for j in range(k):
            self.inputs[:, :B].copy_(staged[j])
            if j:
                self.inputs[0, :b].copy_(tokens[-1])  # the tokens sampled a step ago are this step's inputs
            tokens.append(sample_fn(self.forward(key)[:b]))
        return torch.stack(tokens)
