"""Batched decode attention over a paged KV cache: one query token per sequence.

Each backend takes ``q [B, H, D]``, the layer's pools ``[num_blocks, block_size, H_kv, D]``, padded
block tables ``[B, max_blocks]`` and context lengths ``[B]`` (keys each query attends to, its own
included) and returns ``[B, H, D]``. Shapes depend only on ``B`` and ``max_blocks``, so a step can
be captured in a CUDA graph per (batch, blocks) bucket.

- ``gather``: copy each sequence's blocks into a dense ``[B, H_kv, L, D]`` and call SDPA with a
  length mask. The query heads of one KV head are laid out as SDPA's query-length axis, so grouped
  query attention needs no repeated K/V. Costs one extra read+write of the gathered K/V.
- ``triton``: a paged decode kernel that reads K/V in place (``triton_decode.py``), when Triton is there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_decode(q, k_pool, v_pool, block_tables, context_lens, scale: float) -> torch.Tensor:
    b, heads, d = q.shape
    kv_heads = k_pool.shape[2]
    groups = heads // kv_heads
    k = k_pool[block_tables].flatten(1, 2).transpose(1, 2)  # [B, H_kv, L, D]
    v = v_pool[block_tables].flatten(1, 2).transpose(1, 2)
    length = k.shape[2]
    mask = torch.arange(length, device=q.device)[None, :] < context_lens[:, None]  # [B, L]
    qg = q.view(b, kv_heads, groups, d)  # a KV head's query heads as the query axis
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(b, heads, d)


DECODE_BACKENDS = {"gather": gather_decode}

try:  # the Triton kernel registers itself only where Triton imports
    from servelab.kernels.triton_decode import triton_decode
except ImportError:
    triton_decode = None
else:
    DECODE_BACKENDS["triton"] = triton_decode
