"""Attention over a paged KV cache for a flat, ragged batch of tokens.

One step's tokens sit in one flat tensor: first the *decode* tokens (one query per sequence, in
order), then the *prefill* segments (a chunk of new tokens per sequence, possibly after cached
context). Every token's K/V is first written into the pool at its slot; then

- decode tokens attend to their sequence's whole cache through the block table (``decode.py``);
- a prefill segment attends causally to its cached context plus itself (``prefill.py``): segments
  without cached context in one varlen flash-attention call where available; segments with cached
  context all together in one padded, masked call (``context_prefill.py``); the rest one by one.

A step captured whole in a CUDA graph (``engine/step_graphs.py``) instead carries ``ragged`` tiles:
one kernel attends for every token of the step, whatever its mix (``ragged.py``).

``backend="reference"`` treats every decode as a one-token prefill segment: slow, simple, the
baseline that the batched decode kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from servelab.kernels.context_prefill import ContextBatch, context_prefill
from servelab.kernels.decode import DECODE_BACKENDS
from servelab.kernels.prefill import PrefillSegment, prefill_attention, varlen_prefill
from servelab.kernels.ragged import RaggedTiles, ragged_reference

try:  # the Triton kernels load only where Triton imports (decode.py registers its kernel the same way)
    from servelab.kernels.triton_ragged import INTERPRETED, triton_ragged
except ImportError:
    triton_ragged, INTERPRETED = None, False


def ragged_attention(q, k_pool, v_pool, rt: RaggedTiles, scale: float) -> torch.Tensor:
    """The Triton kernel where it runs (CUDA, or its interpreter), else ``ragged_reference``."""
    if triton_ragged is not None and (q.is_cuda or INTERPRETED):
        return triton_ragged(q, k_pool, v_pool, rt, scale)
    return ragged_reference(q, k_pool, v_pool, rt, scale)


@dataclass
class AttentionMetadata:
    """Where a step's K/V go and what each query attends to."""

    slot_mapping: torch.Tensor  # LongTensor [T]: pool slot of each token's new K/V
    num_decode_tokens: int = 0  # the first num_decode_tokens tokens are decodes
    decode_context_lens: torch.Tensor | None = None  # LongTensor [num_decode]: keys each attends to (incl. itself)
    decode_block_tables: torch.Tensor | None = None  # LongTensor [num_decode, max_blocks], padded with any valid id
    prefills: list[PrefillSegment] = field(default_factory=list)
    # the first ``varlen_segments`` prefills have no cached context and run as one varlen call
    varlen_segments: int = 0
    varlen_cu_seqlens: torch.Tensor | None = None  # IntTensor [varlen_segments + 1], offsets from their first token
    varlen_max_len: int = 0
    # every prefill segment with cached context, batched into one attention call (None: one call per segment)
    context: ContextBatch | None = None
    # every token of the step in one ragged call (set, the fields above but slot_mapping are unused)
    ragged: RaggedTiles | None = None


class PagedAttention(nn.Module):
    """Writes the step's K/V into layer ``layer`` of a KV pool, then attends (see the module docstring)."""

    def __init__(self, layer: int, heads: int, kv_heads: int, head_dim: int, scale: float, backend: str = "gather"):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        if backend != "reference" and backend not in DECODE_BACKENDS:
            raise ValueError(
                f"unknown attention backend {backend!r}; use 'reference' or one of {sorted(DECODE_BACKENDS)}"
            )
        self.layer, self.heads, self.kv_heads, self.head_dim = layer, heads, kv_heads, head_dim
        self.scale = scale
        self.backend = backend

    def forward(self, q, kv_new, meta: AttentionMetadata, kv) -> torch.Tensor:
        """q [T, H, D], kv_new [2, T, H_kv, D] (K and V stacked) -> [T, H*D]. ``kv_new`` None: the step's K/V
        are in the pool already (``kernels/rope_kv_write.py``)."""
        if kv_new is not None:
            self._write(kv_new, meta, kv)
        k_pool, v_pool = kv.k[self.layer], kv.v[self.layer]
        if meta.ragged is not None:
            return ragged_attention(q, k_pool, v_pool, meta.ragged, self.scale).reshape(q.shape[0], -1)
        nd = meta.num_decode_tokens
        if nd and not meta.prefills and self.backend != "reference":  # pure decode step: no copy (CUDA graphs)
            return self._decode(q[:nd], k_pool, v_pool, meta).reshape(nd, -1)
        # the paths below read the new K/V directly; written by the fused kernel, they are read back (eager steps)
        k, v = (kv_new[0], kv_new[1]) if kv_new is not None else self._read_back(meta, kv, q.dtype)
        out = torch.empty_like(q)
        if nd and self.backend == "reference":
            lens = meta.decode_context_lens.tolist()
            for i in range(nd):
                seg = PrefillSegment(i, 1, lens[i] - 1, meta.decode_block_tables[i].long())
                out[i : i + 1] = prefill_attention(
                    q[i : i + 1], k[i : i + 1], v[i : i + 1], seg, k_pool, v_pool, self.scale
                )
        elif nd:
            out[:nd] = self._decode(q[:nd], k_pool, v_pool, meta)
        prefills = meta.prefills
        if meta.varlen_segments:
            first, last = prefills[0], prefills[meta.varlen_segments - 1]
            sl = slice(first.q_start, last.q_start + last.q_len)
            out[sl] = varlen_prefill(q[sl], k[sl], v[sl], meta.varlen_cu_seqlens, meta.varlen_max_len, self.scale)
            prefills = prefills[meta.varlen_segments :]
        if meta.context is not None:
            out[meta.context.out_index] = context_prefill(q, k_pool, v_pool, meta.context, self.scale)
            prefills = [seg for seg in prefills if seg.context_len == 0]
        for seg in prefills:
            sl = slice(seg.q_start, seg.q_start + seg.q_len)
            out[sl] = prefill_attention(q[sl], k[sl], v[sl], seg, k_pool, v_pool, self.scale)
        return out.reshape(q.shape[0], -1)

    def _write(self, kv_new, meta: AttentionMetadata, kv) -> None:
        if hasattr(kv, "kv") and kv_new.dtype == kv.dtype:
            # one scatter for K and V together into the pool's (2, layers, blocks, block_size, ...) storage
            kv.kv[:, self.layer].view(2, -1, self.kv_heads, self.head_dim).index_copy_(1, meta.slot_mapping, kv_new)
        else:
            kv.write(self.layer, meta.slot_mapping, kv_new[0], kv_new[1])

    def _read_back(self, meta: AttentionMetadata, kv, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's K and V [T, H_kv, D] as the pool holds them (one gather each)."""
        shape = (-1, self.kv_heads, self.head_dim)
        k = kv.k[self.layer].view(shape).index_select(0, meta.slot_mapping)
        v = kv.v[self.layer].view(shape).index_select(0, meta.slot_mapping)
        return k.to(dtype), v.to(dtype)

    def _decode(self, q, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        return DECODE_BACKENDS[self.backend](
            q, k_pool, v_pool, meta.decode_block_tables, meta.decode_context_lens, self.scale
        )
