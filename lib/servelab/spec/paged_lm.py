"""One model of a speculative pair: the engine's model code, KV pool, block manager and decode graphs, driven
for a single sequence whose cache can be extended by several tokens at once and rolled back.

Speculative decoding needs two things a serving step does not: logits for *every* position of a multi-token
step (the target scores γ drafted tokens plus one in one forward), and cutting a sequence's cache back to
the accepted prefix. ``PagedLM`` gets both from the engine's own machinery:

- a step of n > 1 new tokens after a cached context runs as n *decode rows* of the same sequence, row i at
  position ``start + i`` attending to ``start + i + 1`` keys through the same block table. Every layer writes
  all n tokens' K/V into the pool before it attends, so that is exactly causal attention over the window;
  and it is a decode-only step, which replays one of the engine's captured CUDA graphs (batch bucket ≥ n);
- rollback is ``BlockManager.truncate``: blocks past the accepted prefix are freed, the stale K/V left in
  the pool are overwritten by the next tokens. No bytes move on the GPU.

The first step of a sequence (its prompt) runs as an ordinary eager prefill.
"""

from __future__ import annotations

import itertools

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine
from servelab.errors import ParameterError
from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.prefill import PrefillSegment

_seq_ids = itertools.count()


def spec_engine_config(
    max_model_len: int,
    max_rows: int,
    *,
    block_size: int = 16,
    cuda_graphs: bool = True,
    attention_backend: str = "auto",
) -> EngineConfig:
    """An engine sized for one sequence of ``max_model_len`` tokens stepping up to ``max_rows`` tokens at once
    (γ + 1 for a target): one decode-graph bucket per row count 1 … ``max_rows``, so a verify of γ + 1 rows
    never pays for padding rows."""
    blocks = -(-max_model_len // block_size) + 1
    return EngineConfig(
        block_size=block_size,
        max_num_seqs=max_rows,
        max_num_batched_tokens=max(max_rows, max_model_len),
        max_model_len=max_model_len,
        num_blocks=blocks,
        cuda_graphs=cuda_graphs,
        step_graphs=False,  # PagedLM runs its own prefill forwards, never the runner's steps
        graph_batch_sizes=tuple(range(1, max_rows + 1)),
        attention_backend=attention_backend,
    )


class PagedLM:
    """A model with its own paged KV cache holding one sequence.

    ``forward(tokens)`` appends ``tokens`` to the sequence, computes their K/V and returns their logits
    ``[len(tokens), vocab]`` (float32); ``truncate(n)`` rolls the cache back to the first ``n`` tokens.
    The logits may be a view of a CUDA graph's output buffer: use them before the next ``forward``.
    """

    def __init__(self, engine: Engine, name: str = "model"):
        self.engine, self.name = engine, name
        self.model, self.pool, self.bm = engine.model, engine.pool, engine.block_manager
        self.tables = engine.runner.tables
        self.graphs = engine.runner.graphs
        self.max_rows = engine.config.max_num_seqs
        self.vocab = engine.model.shape.vocab
        self.device = engine.device
        self.seq_id = None
        self.tokens: list[int] = []  # the tokens whose K/V are in the cache
        self.slots: list[int] = []  # their pool slots
        self.graph_steps = self.eager_steps = 0
        self._chain = None  # uncaptured DecodeGraphs for decode_chain where no graphs were captured (CPU)

    @classmethod
    def from_hf(
        cls,
        hf_model,
        max_model_len: int,
        max_rows: int,
        *,
        name: str = "model",
        cuda_graphs: bool = True,
        block_size: int = 16,
    ) -> PagedLM:
        return cls(
            Engine.from_hf(
                hf_model, spec_engine_config(max_model_len, max_rows, block_size=block_size, cuda_graphs=cuda_graphs)
            ),
            name,
        )

    @property
    def num_cached(self) -> int:
        return len(self.tokens)

    @property
    def max_len(self) -> int:
        return self.engine.max_model_len

    # ---- sequence lifecycle -----------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence and give its blocks back."""
        if self.seq_id is not None:
            self.bm.free(self.seq_id)
            self.tables.release(self.seq_id)
        self.seq_id, self.tokens, self.slots = None, [], []

    def truncate(self, num_tokens: int) -> None:
        """Roll the cache back to the first ``num_tokens`` tokens (host bookkeeping only: no GPU work)."""
        if not 0 <= num_tokens <= self.num_cached:
            raise ValueError(f"{self.name}: cannot truncate {self.num_cached} cached tokens to {num_tokens}")
        if num_tokens == self.num_cached:
            return
        if num_tokens == 0:
            self.reset()
            return
        self.bm.truncate(self.seq_id, num_tokens)
        del self.tokens[num_tokens:], self.slots[num_tokens:]

    # ---- forward ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: list[int], *, last_only: bool = False) -> torch.Tensor:
        """Append and compute ``tokens``; their logits ``[n, vocab]`` (``[1, vocab]`` for the last if ``last_only``)."""
        n = len(tokens)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if any(not 0 <= t < self.vocab for t in tokens):
            raise ParameterError(f"{self.name}: token ids must be in [0, {self.vocab})")
        start = self.num_cached
        if start + n > self.max_len:
            raise ParameterError(f"{self.name}: {start + n} tokens exceed max_model_len={self.max_len}")
        if self.seq_id is None:
            self.seq_id = next(_seq_ids)
            self.bm.allocate(self.seq_id, n)
            new_slots = self.bm.slot_mapping(self.seq_id, 0, n)
        else:
            new_slots = self.bm.append(self.seq_id, n)
        self.tokens += tokens
        self.slots += new_slots
        if start > 0 and n <= self.max_rows:
            out = self._decode_rows(tokens, list(range(start, start + n)), new_slots)
        else:
            out = self._prefill(tokens, start, new_slots, last_only)
        return out[-1:] if last_only else out

    @torch.inference_mode()
    def decode_chain(self, first_token: int, k: int, sample_fn) -> list[int] | None:
        """``k`` one-token decode steps back to back, each fed the token the step before sampled, on the device:
        the host waits once, at the end (the draft's γ proposals without γ round trips). Step 0's input is
        ``first_token``; ``sample_fn(logits [1, vocab]) -> LongTensor [1]`` runs on the device.

        The cache gains ``first_token`` and the first ``k - 1`` sampled tokens; returns the ``k`` sampled tokens,
        or None (nothing changed) when no captured graph bucket holds the steps.
        """
        from servelab.engine.cuda_graphs import DecodeGraphs

        start = self.num_cached
        if self.seq_id is None or start + k > self.max_len:
            raise ParameterError(f"{self.name}: decode_chain needs a prefilled sequence with room for {k} tokens")
        graphs = self.graphs
        if graphs is None:  # CPU, or graphs off: the same packed-input steps, run eagerly
            if self._chain is None:
                self._chain = DecodeGraphs(
                    self.model, self.pool, self.tables, max_batch=1, scratch_block=self.engine.num_blocks
                )
            graphs = self._chain
        slots = self.bm.append(self.seq_id, k)
        positions = list(range(start, start + k))
        rows = self.tables.rows_for([self.seq_id] * k, positions, slots)
        out = graphs.run_steps(
            [first_token], [[(p, s, r)] for p, s, r in zip(positions, slots, rows, strict=True)], sample_fn
        )
        if out is None:
            self.bm.truncate(self.seq_id, start)
            return None
        tokens = out[:, 0].tolist()
        self.tokens += [first_token] + tokens[:-1]
        self.slots += slots
        if graphs is self.graphs:
            self.graph_steps += k
        else:
            self.eager_steps += k
        return tokens

    def _decode_rows(self, tokens, positions, slots) -> torch.Tensor:
        rows = self.tables.rows_for([self.seq_id] * len(tokens), positions, slots)
        if self.graphs is not None:
            out = self.graphs.run(tokens, positions, slots, rows)
            if out is not None:
                self.graph_steps += 1
                return out
        self.eager_steps += 1
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(tokens),
            decode_context_lens=torch.tensor([p + 1 for p in positions], dtype=torch.long, device=dev),
            decode_block_tables=self.tables.gather(rows, positions[-1] // self.bm.block_size + 1),
        )
        return self.model(
            torch.tensor(tokens, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            self.pool,
        )

    def _prefill(self, tokens, start, slots, last_only) -> torch.Tensor:
        self.eager_steps += 1
        dev, n = self.device, len(tokens)
        table = torch.tensor(self.bm.block_table(self.seq_id), dtype=torch.long, device=dev) if start else None
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            prefills=[PrefillSegment(0, n, start, table)],
        )
        idx = torch.tensor([n - 1] if last_only else list(range(n)), dtype=torch.long, device=dev)
        return self.model(
            torch.tensor(tokens, dtype=torch.long, device=dev),
            torch.arange(start, start + n, dtype=torch.long, device=dev),
            meta,
            self.pool,
            idx,
        )
