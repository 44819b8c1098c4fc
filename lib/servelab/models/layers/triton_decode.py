"""A paged decode-attention kernel in Triton: reads each sequence's K/V in place through its block table.

One program per (sequence, KV head) computes all query heads of that KV head (grouped-query
attention loads each K/V tile once for the whole group), walking the sequence's keys
``KEYS_PER_ITER`` at a time with an online softmax (running max and sum), so K and V are read from
HBM exactly once and nothing is materialised. Key ``p`` of a sequence sits in pool block
``block_table[p // block_size]`` at offset ``p % block_size``.

Tests run it on the CPU under ``TRITON_INTERPRET=1`` against the gather backend.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

KEYS_PER_ITER = 64
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attend_tile(q, K, V, BT, start, length, b, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh,
                 stride_btb, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, KEYS: tl.constexpr,
                 IEEE: tl.constexpr):
    """Fold keys [start, start + KEYS) of one sequence into the running (max, sum, accumulator)."""
    offs_d = tl.arange(0, HEAD_DIM)
    pos = start + tl.arange(0, KEYS)
    ok = pos < length
    blk = tl.load(BT + b * stride_btb + pos // BLOCK_SIZE, mask=ok, other=0)
    base = blk.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kvh * stride_kh
    k = tl.load(K + base[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(ok[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    v = tl.load(V + base[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_sum, acc


@triton.jit
def _paged_decode_kernel(Q, K, V, BT, LENS, O, scale,
                         stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                         GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, KEYS: tl.constexpr, IEEE: tl.constexpr,
                         INTERPRETED: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    length = tl.load(LENS + b)
    offs_g = tl.arange(0, GROUPS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUPS
    heads = kvh * GROUPS + offs_g
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=g_ok[:, None], other=0.0)
    m = tl.full([GROUPS_PAD], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([GROUPS_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUPS_PAD, HEAD_DIM], dtype=tl.float32)
    if INTERPRETED:  # the interpreter cannot range() over a loaded value; a while loop is the same walk
        start = 0
        while start < length:
            m, l_sum, acc = _attend_tile(q, K, V, BT, start, length, b, kvh, m, l_sum, acc, scale, stride_kb,
                                         stride_ks, stride_kh, stride_btb, HEAD_DIM, BLOCK_SIZE, KEYS, IEEE)
            start += KEYS
    else:  # a range() loop the compiler can software-pipeline
        for start in range(0, length, KEYS):
            m, l_sum, acc = _attend_tile(q, K, V, BT, start, length, b, kvh, m, l_sum, acc, scale, stride_kb,
                                         stride_ks, stride_kh, stride_btb, HEAD_DIM, BLOCK_SIZE, KEYS, IEEE)
    out = acc / l_sum[:, None]
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=g_ok[:, None])


def triton_decode(q, k_pool, v_pool, block_tables, context_lens, scale: float) -> torch.Tensor:
    """Same contract as ``decode.gather_decode``: q [B, H, D] -> [B, H, D]."""
    b, heads, d = q.shape
    _, block_size, kv_heads, d_k = k_pool.shape
    if d != d_k or d & (d - 1) or d < 16:
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16 matching the pool, got {d}")
    groups = heads // kv_heads
    q = q.contiguous()
    out = torch.empty_like(q)
    _paged_decode_kernel[(b, kv_heads)](
        q, k_pool, v_pool, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUPS=groups, GROUPS_PAD=max(16, triton.next_power_of_2(groups)), HEAD_DIM=d, BLOCK_SIZE=block_size,
        KEYS=KEYS_PER_ITER, IEEE=q.dtype == torch.float32, INTERPRETED=INTERPRETED)
    return out
