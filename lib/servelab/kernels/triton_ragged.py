"""The ragged paged-attention kernel in Triton: every tile of a step (``ragged.py``) in one launch.

A packed tile's program (one per tile and KV head) has the tile's tokens × the query heads of that KV
head as its query rows (grouped-query attention reads each K/V tile once for the whole group); a long
tile's program (one per tile and query head) has the tile's tokens of one head. A row's position is
its token's. It walks the sequence's keys ``KEYS`` at a time up to the tile's last position, through the
block table, with an online softmax; a key is visible to a row when its position is at most the row's.
Key 0 is visible to every row, so no row's running maximum stays at -inf past the first key tile.
Empty tiles (padding) return at once, which is what lets the launch grid, and a CUDA graph around
it, stay fixed while the step's mix changes. The head axis is padded to a power of two and masked, as in
``triton_decode.py``, so any head size runs.

Tests run it on the CPU under ``TRITON_INTERPRET=1`` against ``ragged_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from servelab.kernels.ragged import POS0, Q_LEN, Q_START, ROW, RaggedTiles
from servelab.kernels.split_kv import head_pad
from servelab.kernels.triton_decode import INTERPRETED

KEYS_PER_ITER = 64


@triton.jit
def _fold_keys(
    q,
    K,
    V,
    BT,
    start,
    n_keys,
    qpos,
    row,
    kvh,
    m,
    l_sum,
    acc,
    scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Fold keys [start, start + KEYS) of one sequence into every row's running (max, sum, accumulator)."""
    offs_d = tl.arange(0, HEAD_PAD)
    pos = start + tl.arange(0, KEYS)
    ok = pos < n_keys
    blk = tl.load(BT + row * stride_btb + pos // BLOCK_SIZE, mask=ok, other=0)
    base = blk.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kvh * stride_kh
    # no padded lanes at a power-of-two head: its mask (and code) as before the padding
    kv_mask = ok[:, None] if HEAD_DIM == HEAD_PAD else ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + base[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") if IEEE else tl.dot(q, tl.trans(k))
    visible = ok[None, :] & (pos[None, :] <= qpos[:, None])
    s = tl.where(visible, s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    v = tl.load(V + base[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee") if IEEE else tl.dot(p.to(v.dtype), v)
    return m_new, l_sum, acc * alpha[:, None] + pv


@triton.jit
def _ragged_kernel(
    Q,
    K,
    V,
    BT,
    TILES,
    Out,
    scale,
    stride_tiles,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    stride_ot,
    stride_oh,
    GROUPS: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
    INTERPRETED: tl.constexpr,
    C_ROW: tl.constexpr,
    C_START: tl.constexpr,
    C_LEN: tl.constexpr,
    C_POS: tl.constexpr,
    PER_HEAD: tl.constexpr,
):
    tile = tl.program_id(0)
    q_len = tl.load(TILES + C_LEN * stride_tiles + tile)
    if q_len == 0:
        return
    row = tl.load(TILES + C_ROW * stride_tiles + tile)
    q_start = tl.load(TILES + C_START * stride_tiles + tile)
    pos0 = tl.load(TILES + C_POS * stride_tiles + tile)
    offs_m = tl.arange(0, TILE_TOKENS * GROUPS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    if PER_HEAD:  # grid axis 1 is the query head; GROUPS_PAD is 1
        kvh = tl.program_id(1) // GROUPS
        t = offs_m
        head = tl.program_id(1) + 0 * offs_m
        row_ok = t < q_len
    else:  # grid axis 1 is the KV head
        kvh = tl.program_id(1)
        t = offs_m // GROUPS_PAD
        g = offs_m % GROUPS_PAD
        row_ok = (t < q_len) & (g < GROUPS)
        head = kvh * GROUPS + g
    token = (q_start + t).to(tl.int64)
    qpos = pos0 + t
    row_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=row_mask, other=0.0)
    m = tl.full([TILE_TOKENS * GROUPS_PAD], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([TILE_TOKENS * GROUPS_PAD], dtype=tl.float32)
    acc = tl.zeros([TILE_TOKENS * GROUPS_PAD, HEAD_PAD], dtype=tl.float32)
    n_keys = pos0 + q_len
    if INTERPRETED:  # the interpreter cannot range() over a loaded value; a while loop is the same walk
        start = 0
        while start < n_keys:
            m, l_sum, acc = _fold_keys(
                q,
                K,
                V,
                BT,
                start,
                n_keys,
                qpos,
                row,
                kvh,
                m,
                l_sum,
                acc,
                scale,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_btb,
                HEAD_DIM,
                HEAD_PAD,
                BLOCK_SIZE,
                KEYS,
                IEEE,
            )
            start += KEYS
    else:
        for start in range(0, n_keys, KEYS):
            m, l_sum, acc = _fold_keys(
                q,
                K,
                V,
                BT,
                start,
                n_keys,
                qpos,
                row,
                kvh,
                m,
                l_sum,
                acc,
                scale,
                stride_kb,
                stride_ks,
                stride_kh,
                stride_btb,
                HEAD_DIM,
                HEAD_PAD,
                BLOCK_SIZE,
                KEYS,
                IEEE,
            )
    out = acc / l_sum[:, None]
    tl.store(
        Out + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=row_mask,
    )


def triton_ragged(q, k_pool, v_pool, rt: RaggedTiles, scale: float, *, keys: int = KEYS_PER_ITER) -> torch.Tensor:
    """Same contract as ``ragged.ragged_reference``: q [T, H, D] -> [T, H, D], rows of no tile 0."""
    t, heads, d = q.shape
    _, block_size, kv_heads, d_k = k_pool.shape
    if d != d_k:
        raise ValueError(f"query head_dim {d} does not match the KV pool's {d_k}")
    d_pad = head_pad(d)
    groups = heads // kv_heads
    groups_pad = 1 << (groups - 1).bit_length()
    if rt.tile_tokens * groups_pad < 16 or rt.tile_tokens & (rt.tile_tokens - 1):
        raise ValueError(f"tile_tokens={rt.tile_tokens} must be a power of two with tile_tokens × {groups_pad} >= 16")
    if rt.long_tiles is not None and (rt.long_tile_tokens < 16 or rt.long_tile_tokens & (rt.long_tile_tokens - 1)):
        raise ValueError(f"long_tile_tokens={rt.long_tile_tokens} must be a power of two >= 16")
    q = q.contiguous()
    out = torch.zeros_like(q)  # padding tokens belong to no tile; zeros keep them finite through the MLP
    launches = [(rt.tiles, kv_heads, groups_pad, rt.tile_tokens, False)]
    if rt.long_tiles is not None and rt.long_tiles.shape[1]:
        launches.append((rt.long_tiles, heads, 1, rt.long_tile_tokens, True))
    for tiles, programs, pad, tokens, per_head in launches:
        _ragged_kernel[(tiles.shape[1], programs)](
            q,
            k_pool,
            v_pool,
            rt.block_tables,
            tiles,
            out,
            scale,
            tiles.stride(0),
            q.stride(0),
            q.stride(1),
            k_pool.stride(0),
            k_pool.stride(1),
            k_pool.stride(2),
            rt.block_tables.stride(0),
            out.stride(0),
            out.stride(1),
            GROUPS=groups,
            GROUPS_PAD=pad,
            TILE_TOKENS=tokens,
            HEAD_DIM=d,
            HEAD_PAD=d_pad,
            BLOCK_SIZE=block_size,
            KEYS=keys,
            IEEE=q.dtype == torch.float32,
            INTERPRETED=INTERPRETED,
            C_ROW=ROW,
            C_START=Q_START,
            C_LEN=Q_LEN,
            C_POS=POS0,
            PER_HEAD=per_head,
            num_warps=4 if d_pad * tokens * pad <= 64 * 128 else 8,
        )
    return out
