"""Whole prefill and mixed steps captured as CUDA graphs, one per token-count bucket.

Run eagerly, a step that is not a pure decode launches every kernel of every layer from Python: some
two dozen per layer, at tens of microseconds each on a slow host, so a 16-token prefill costs as much
as a 2,048-token one and a chunked-prefill step costs many times its GPU work. Here a step of ``T``
tokens runs in the graph of the smallest bucket ``T_b >= T``, whatever its mix of decodes, fresh
prompts and chunks after cached context: attention is one ragged kernel over a fixed-width tile table
(``models/layers/ragged.py``), so no tensor's shape depends on the mix. The ``T_b - T`` padding
tokens write their K/V to a scratch block that no sequence owns and belong to no tile; they cost
GPU time in the matrix products and change nothing.

A step's inputs travel in one host-to-device copy: token ids, positions, slots, the tile tables and the
rows whose logits are sampled, laid out per bucket at the start of one device buffer.

Long contexts: a decode over 16K keys would be one program walking them all while the step waits. The tiles
that read the most keys become *split columns* (``ragged.plan_splits``), one program per chunk of keys, in the
same kernel launch. Their number is fixed for the engine (``ragged.split_budget``: as many as a decode of the
longest context the block tables hold gets), so every graph has the same kernel per layer whatever the step's
contexts; with short contexts the columns are empty, and a table too narrow to split has none.
"""

from __future__ import annotations

import bisect

import torch

from servelab.engine.block_tables import DeviceBlockTables
from servelab.engine.cuda_graphs import capture_graph
from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.ragged import (
    RaggedTiles,
    max_long_tiles,
    max_tiles,
    plan_splits,
    plan_tiles,
    ragged_long_tile_tokens,
    ragged_tile_tokens,
    split_budget,
)
from servelab.kernels.split_kv import MIN_SPLIT_KEYS

# about 1.5x apart, so padding wastes at most a third of a step's tokens
STEP_GRAPH_SIZES = (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def step_graph_sizes(max_num_batched_tokens: int) -> list[int]:
    """The default buckets: the ladder below ``max_num_batched_tokens``, and that budget itself."""
    return sorted({t for t in STEP_GRAPH_SIZES if t < max_num_batched_tokens} | {max_num_batched_tokens})


class StepGraphs:
    """Captured whole steps of ``model`` on ``pool``; ``run(items)`` replays the right bucket."""

    def __init__(
        self,
        model,
        pool,
        tables: DeviceBlockTables,
        *,
        sizes,
        max_seqs: int,
        scratch_block: int,
        min_split_keys: int = MIN_SPLIT_KEYS,
        split_kv: bool = True,
    ):
        """Nothing is captured until ``capture()``; uncaptured (e.g. on a CPU), a bucket runs the same padded step
        eagerly. ``min_split_keys``: the fewest keys one split program walks (tests set it small); ``split_kv``
        False: no split columns, every tile in one program (the kernel as it was before split-KV)."""
        s = model.shape
        self.model, self.pool, self.tables = model, pool, tables
        self.sizes = sorted(set(sizes))
        self.max_seqs = max_seqs
        self.tile_tokens = ragged_tile_tokens(s.heads, s.kv_heads)
        self.long_tile_tokens = ragged_long_tile_tokens(s.head_dim)
        self.scratch_slot = scratch_block * pool.block_size
        self.kv_heads, self.min_split_keys = s.kv_heads, min_split_keys
        device = torch.device(pool.device)
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
        max_context = tables.device_table.shape[1] * pool.block_size
        self.split_columns = split_budget(s.kv_heads, max_context, self.sms, min_keys=min_split_keys) if split_kv else 0
        # one counter per (column, KV head), shared by every layer and graph: the kernel leaves it at 0
        self.split_counters = torch.zeros(self.split_columns * s.kv_heads, dtype=torch.int32, device=pool.device)
        self.buffer = torch.zeros(self._layout(self.sizes[-1])[-1], dtype=torch.long, device=pool.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.memory_pool = None

    def _layout(self, size: int) -> tuple[int, int, int, int]:
        """(packed tiles, long tiles, sampled rows, total longs) of bucket ``size``:
        [ids | positions | slots | packed tiles 4×n | long tiles 4×m | split columns 6×c | sampled rows]."""
        n_tiles = max_tiles(size, self.max_seqs, self.tile_tokens)
        n_long = max_long_tiles(size, self.long_tile_tokens)
        n_rows = min(size, self.max_seqs)
        return n_tiles, n_long, n_rows, 3 * size + 4 * (n_tiles + n_long) + 6 * self.split_columns + n_rows

    def _forward(self, size: int):
        n_tiles, n_long, n_rows, total = self._layout(size)
        tokens = self.buffer[: 3 * size].view(3, size)
        at = 3 * size + 4 * n_tiles
        tiles = self.buffer[3 * size : at].view(4, n_tiles)
        long = self.buffer[at : at + 4 * n_long].view(4, n_long)
        at += 4 * n_long
        split = self.buffer[at : at + 6 * self.split_columns].view(6, self.split_columns)
        rt = RaggedTiles(tiles, self.tables.device_table, self.tile_tokens, long, self.long_tile_tokens)
        if self.split_columns:
            rt.split_tiles, rt.split_counters = split, self.split_counters
        meta = AttentionMetadata(slot_mapping=tokens[2], ragged=rt)
        return self.model(tokens[0], tokens[1], meta, self.pool, self.buffer[total - n_rows : total])

    @torch.inference_mode()
    def capture(self, progress=None) -> None:
        """Capture every bucket, largest first so that smaller graphs reuse the largest one's memory."""
        self.memory_pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self._load_padding(size)
            self.graphs[size] = capture_graph(lambda size=size: self._forward(size), self.memory_pool)
            if progress is not None:
                progress.update(1)
        torch.cuda.synchronize()

    def _load_padding(self, size: int) -> None:
        """An all-padding step: every token writes to the scratch block, no tile has tokens."""
        self.buffer.zero_()
        self.buffer[2 * size : 3 * size] = self.scratch_slot

    def bucket(self, num_tokens: int, num_items: int) -> int | None:
        """The smallest bucket that holds a step of ``num_tokens`` tokens over ``num_items`` sequences."""
        if num_items > self.max_seqs:
            return None
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, items, patch=None) -> tuple[torch.Tensor, list] | None:
        """Run one step's scheduled ``items``: ``(logits [S, vocab], the S items that sample)``, or None when no
        bucket holds the step (the caller runs it eagerly). ``patch(ids)``, if given, edits the step's token ids
        (``items``' tokens in order) on the device before it runs (tokens not read back yet)."""
        num_tokens = sum(it.num_tokens for it in items)
        size = self.bucket(num_tokens, len(items))
        if size is None or (self.graphs and size not in self.graphs):
            return None
        seq_ids = [it.seq.seq_id for it in items]
        # a step may write into a block that copy-on-write just replaced: check the first and the last block written
        self.tables.rows_for(seq_ids, [it.start for it in items], [it.slots[0] for it in items])
        rows = self.tables.rows_for(
            seq_ids, [it.start + it.num_tokens - 1 for it in items], [it.slots[-1] for it in items]
        )
        ids, pos, slots, runs, sampled, sampling = [], [], [], [], [], []
        for it, row in zip(items, rows, strict=True):
            runs.append((row, len(ids), it.num_tokens, it.start))
            ids += it.seq.token_ids(it.start, it.start + it.num_tokens)
            pos += range(it.start, it.start + it.num_tokens)
            slots += it.slots
            if it.samples:
                sampled.append(len(ids) - 1)
                sampling.append(it)
        n_tiles, n_long, n_rows, _ = self._layout(size)
        packed, long = plan_tiles(runs, self.tile_tokens, self.long_tile_tokens)
        packed, split = plan_splits(packed, self.split_columns, self.kv_heads, self.sms, min_keys=self.min_split_keys)
        pad_t = size - num_tokens
        host = (
            ids
            + [0] * pad_t
            + pos
            + [0] * pad_t
            + slots
            + [self.scratch_slot] * pad_t
            + _columns(packed, n_tiles)
            + _columns(long, n_long)
            + _columns(split, self.split_columns, rows=6)
            + sampled
            + [0] * (n_rows - len(sampled))
        )
        self.buffer[: len(host)].copy_(torch.tensor(host, dtype=torch.long), non_blocking=True)
        if patch is not None:
            patch(self.buffer[:num_tokens])
        if size in self.graphs:
            graph, out = self.graphs[size]
            graph.replay()
        else:
            with torch.inference_mode():
                out = self._forward(size)
        return out[: len(sampling)], sampling


def _columns(tiles: list, width: int, rows: int = 4) -> list[int]:
    """A tile table ``[rows, width]`` flattened row by row, padded with empty tiles (0 tokens)."""
    pad = [0] * (width - len(tiles))
    return [v for col in (zip(*tiles, strict=True) if tiles else [()] * rows) for v in (*col, *pad)]
