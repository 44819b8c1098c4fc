"""Prefill attention for every segment with cached context in a step, in one call per layer.

A prefill chunk after cached tokens (a chunked prompt's later chunks, a prompt whose prefix the prefix
cache served, a recompute) attends to its cached context, read back from the paged pool, and to its
own tokens. Done one segment at a time, each costs a gather, a mask and an SDPA call per layer: a
dozen kernel launches per segment and layer, which on a host that launches slowly made a step with a
few such segments cost many times its GPU work. Here all of a step's context segments are padded into
one batch: per layer one gather of K and of V from the pool, one gather of the queries, one masked
SDPA call and one scatter of the outputs back, whatever the number of segments.

The index tensors and the mask depend only on the step's schedule, so ``build_context_batch`` makes
them once per step on the host and every layer reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KEY_ALIGN = 16  # pad the key axis so the mask rows stay aligned for the fused masked kernels


@dataclass
class ContextBatch:
    q_index: torch.Tensor  # LongTensor [S, Q]: flat index of each segment's query rows (padding repeats its first)
    q_valid: torch.Tensor  # BoolTensor [S, Q]
    out_index: torch.Tensor  # LongTensor [n]: q_index[q_valid], where the outputs go back in the flat batch
    kv_slots: torch.Tensor  # LongTensor [S, L]: pool slot of key position j (padding: slot 0, masked out)
    mask: torch.Tensor  # BoolTensor [S, 1, Q, L]: key j visible to query row r


def build_context_batch(segments, device) -> ContextBatch:
    """``segments``: (flat start of the chunk, new tokens n, cached tokens c, pool slots of positions 0 … c+n-1).

    Query row r of a segment sits at position c + r and sees keys 0 … c + r. Padded query rows see key 0
    only (their output is discarded; a row with no visible key would give NaN).
    """
    s = len(segments)
    q = max(n for _, n, _, _ in segments)
    length = max(c + n for _, n, c, _ in segments)
    length = -(-length // KEY_ALIGN) * KEY_ALIGN
    q_index = torch.zeros(s, q, dtype=torch.long)
    q_valid = torch.zeros(s, q, dtype=torch.bool)
    kv_slots = torch.zeros(s, length, dtype=torch.long)
    mask = torch.zeros(s, 1, q, length, dtype=torch.bool)
    keys = torch.arange(length)
    for i, (start, n, c, slots) in enumerate(segments):
        q_index[i] = start
        q_index[i, :n] = torch.arange(start, start + n)
        q_valid[i, :n] = True
        kv_slots[i, : c + n] = torch.as_tensor(slots[: c + n], dtype=torch.long)
        mask[i, 0, :n] = keys[None, :] <= (c + torch.arange(n))[:, None]
        mask[i, 0, n:, 0] = True
    return ContextBatch(
        q_index.to(device), q_valid.to(device), q_index[q_valid].to(device), kv_slots.to(device), mask.to(device)
    )


def context_prefill(q, k_pool, v_pool, cb: ContextBatch, scale: float) -> torch.Tensor:
    """q [T, H, D] (the whole flat batch), pools [blocks, block_size, H_kv, D] -> [n, H, D] for ``cb.out_index``."""
    heads, kv_heads = q.shape[1], k_pool.shape[2]
    k = k_pool.flatten(0, 1)[cb.kv_slots].transpose(1, 2)  # [S, H_kv, L, D]
    v = v_pool.flatten(0, 1)[cb.kv_slots].transpose(1, 2)
    if heads != kv_heads:  # the fused masked kernels take no grouped heads: repeat K/V for each query head
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q[cb.q_index].transpose(1, 2), k, v, attn_mask=cb.mask, scale=scale)
    return out.transpose(1, 2)[cb.q_valid]
