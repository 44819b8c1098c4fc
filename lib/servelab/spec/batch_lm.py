"""B sequences of one model on the engine's paged KV cache, stepped as packed decode rows: the model side of the
batched speculative loop (``batch_decoder``).

``PagedLM`` holds one sequence; speculation at batch B needs B of them in every step. The draft's γ steps each
run one row per sequence (plus a catch-up row for a sequence whose last draft was kept); the target's verify
runs B·(γ + 1) rows, row (i, j) at position T_i + j attending to T_i + j + 1 keys through sequence i's block
table. Every row is a decode row, so each step replays one captured decode graph whose bucket holds the row
count (padding rows write to the scratch block and change nothing).

Nothing here reads the device: ``extend`` and ``column`` plan a step's inputs on the host (the caller packs a
whole round into one host-to-device copy), ``replay`` runs a step from inputs already on the device, and
``truncate`` (the rollback) is block-manager bookkeeping. Prompts are prefilled eagerly, in one forward.
"""

from __future__ import annotations

import itertools

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.cuda_graphs import DecodeGraphs
from servelab.engine.engine import Engine
from servelab.errors import ParameterError
from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.prefill import PrefillSegment

_seq_ids = itertools.count()


def batch_engine_config(
    max_model_len: int, max_seqs: int, row_buckets, *, block_size: int = 16, cuda_graphs: bool = True
) -> EngineConfig:
    """An engine for ``max_seqs`` sequences of ``max_model_len`` tokens whose decode graphs are captured at the
    row counts ``row_buckets`` (a step of r rows replays the smallest bucket ≥ r)."""
    buckets = tuple(sorted(set(row_buckets)))
    rows = max(buckets[-1], max_seqs)
    blocks = max_seqs * (-(-max_model_len // block_size)) + 1
    return EngineConfig(
        block_size=block_size,
        max_num_seqs=rows,  # also the block-table rows: one per sequence is plenty
        max_num_batched_tokens=max(rows, max_model_len),
        max_model_len=max_model_len,
        num_blocks=blocks,
        cuda_graphs=cuda_graphs,
        step_graphs=False,  # prefills run eagerly here, never the runner's steps
        graph_batch_sizes=buckets,
    )


class PagedBatch:
    """A batch of sequences of one model, each with its own paged KV cache; ``lengths[i]`` tokens cached."""

    def __init__(self, engine: Engine, name: str = "model"):
        self.engine, self.name = engine, name
        self.model, self.pool, self.bm = engine.model, engine.pool, engine.block_manager
        self.tables = engine.runner.tables
        graphs = engine.runner.graphs
        if graphs is None:  # CPU, or graphs off: the same packed-input steps, run eagerly
            graphs = DecodeGraphs(
                self.model,
                self.pool,
                self.tables,
                max_batch=engine.config.max_num_seqs,
                scratch_block=engine.num_blocks,
                batch_sizes=engine.config.graph_batch_sizes,
            )
        self.graphs = graphs
        self.inputs = graphs.inputs  # [5, rows] on the device: ids, positions, slots, context lengths, table rows
        self.pad = tuple(graphs.padding.tolist())  # host copy of one padding column (built on the host: no sync)
        self.vocab = engine.model.shape.vocab
        self.device = engine.device
        self.block_size = self.bm.block_size
        self.seq_ids: list[int] = []
        self.lengths: list[int] = []
        self.steps = 0  # decode steps replayed (each of many rows)

    @classmethod
    def from_hf(
        cls,
        hf_model,
        max_model_len: int,
        max_seqs: int,
        row_buckets,
        *,
        name: str = "model",
        cuda_graphs: bool = True,
        block_size: int = 16,
    ) -> PagedBatch:
        cfg = batch_engine_config(max_model_len, max_seqs, row_buckets, block_size=block_size, cuda_graphs=cuda_graphs)
        return cls(Engine.from_hf(hf_model, cfg), name)

    @property
    def max_len(self) -> int:
        return self.engine.max_model_len

    @property
    def captured(self) -> bool:
        return bool(self.graphs.graphs)

    # ---- sequences ----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every sequence and give the blocks back."""
        for sid in self.seq_ids:
            self.bm.free(sid)
            self.tables.release(sid)
        self.seq_ids, self.lengths = [], []

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Start one sequence per prompt (after ``reset``), all in one eager forward (one attention segment
        each); the logits of each prompt's last token ``[B, vocab]``."""
        if self.seq_ids:
            raise RuntimeError(f"{self.name}: reset() before prefilling a new batch")
        tokens, positions, slots, segments, last = [], [], [], [], []
        for p in prompts:
            if not p or len(p) >= self.max_len:
                raise ParameterError(f"{self.name}: a prompt needs 1 to {self.max_len - 1} tokens, got {len(p)}")
            if any(not 0 <= t < self.vocab for t in p):
                raise ParameterError(f"{self.name}: token ids must be in [0, {self.vocab})")
            sid = next(_seq_ids)
            self.bm.allocate(sid, len(p))
            self.seq_ids.append(sid)
            self.lengths.append(len(p))
            segments.append(PrefillSegment(len(tokens), len(p), 0, None))
            slots += self.bm.slot_mapping(sid, 0, len(p))
            positions += range(len(p))
            tokens += p
            last.append(len(tokens) - 1)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev), prefills=segments)
        return self.model(
            torch.tensor(tokens, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            self.pool,
            torch.tensor(last, dtype=torch.long, device=dev),
        )

    def extend(self, i: int, n: int) -> list[int]:
        """Give sequence i slots for ``n`` new tokens (positions ``lengths[i]`` …); host bookkeeping only."""
        if self.lengths[i] + n > self.max_len:
            raise ParameterError(f"{self.name}: {self.lengths[i] + n} tokens exceed max_model_len={self.max_len}")
        slots = self.bm.append(self.seq_ids[i], n)
        self.lengths[i] += n
        return slots

    def truncate(self, i: int, n: int) -> None:
        """Roll sequence i back to its first ``n`` tokens: blocks past them are freed, no GPU work."""
        if not 0 < n <= self.lengths[i]:
            raise ValueError(f"{self.name}: cannot truncate {self.lengths[i]} cached tokens to {n}")
        if n < self.lengths[i]:
            self.bm.truncate(self.seq_ids[i], n)
            self.lengths[i] = n

    def table_rows(self, seqs: list[int], first: list[int], last: list[int]) -> list[int]:
        """Each sequence's row in the device block table, refreshed for every block its positions
        ``first[i] … last[i]`` touch (a block freed by a rollback may come back as another one)."""
        ids, pos, slots = [], [], []
        bs = self.block_size
        for i, a, b in zip(seqs, first, last, strict=True):
            sid = self.seq_ids[i]
            for p in [a] + list(range(a + bs - a % bs, b + 1, bs)):
                ids.append(sid)
                pos.append(p)
                slots.append(self.bm.slot_mapping(sid, p, p + 1)[0])
        rows = self.tables.rows_for(ids, pos, slots)
        out = dict(zip(ids, rows, strict=True))
        return [out[self.seq_ids[i]] for i in seqs]

    # ---- steps --------------------------------------------------------------------------------------
    def column(self, token: int, position: int, slot: int, table_row: int) -> tuple[int, int, int, int, int]:
        """One decode row's packed inputs: token, position, slot, keys attended (position + 1), table row."""
        return (token, position, slot, position + 1, table_row)

    def bucket(self, rows: int, max_position: int) -> tuple[int, int]:
        """The captured (rows, blocks) bucket a step of ``rows`` rows up to ``max_position`` replays."""
        key = self.graphs.bucket(rows, max_position // self.block_size + 1)
        if key is None or (self.captured and key not in self.graphs.graphs):
            raise ParameterError(
                f"{self.name}: no decode graph holds {rows} rows (captured: {self.graphs.batch_sizes}); "
                "build it with row_buckets that include this step"
            )
        return key

    def padded(self, cols: list[tuple], width: int) -> list[list[int]]:
        """``cols`` followed by padding columns up to ``width``, as 5 lists (ids, positions, slots, lengths, rows)."""
        return [list(x) for x in zip(*(cols + [self.pad] * (width - len(cols))), strict=True)]

    def replay(self, key: tuple[int, int], staged: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Load the step's inputs ``staged`` ([5, key rows], on the device), then ``ids`` over its first token ids
        where given (tokens the device chose a step ago), and run it; logits ``[rows, vocab]`` (a view of the
        graph's output buffer: read it before the next replay)."""
        self.inputs[:, : key[0]].copy_(staged)
        if ids is not None:
            self.inputs[0, : ids.shape[0]].copy_(ids)
        self.steps += 1
        return self.graphs.forward(key)
