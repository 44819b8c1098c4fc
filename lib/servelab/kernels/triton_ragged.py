"""The ragged paged-attention kernel in Triton: every packed tile of a step (``ragged.py``) in one launch, its long
tiles in a second.

A packed tile's program (one per tile and KV head) has the tile's tokens × the query heads of that KV
head as its query rows (grouped-query attention reads each K/V tile once for the whole group). A row's position is
its token's. It walks the sequence's keys ``KEYS`` at a time up to the tile's last position, through the
block table, with an online softmax; a key is visible to a row when its position is at most the row's.
Key 0 is visible to every row, so no row's running maximum stays at -inf past the first key tile.
Empty tiles (padding) return at once, which is what lets the launch grid, and a CUDA graph around
it, stay fixed while the step's mix changes. The head axis is padded to a power of two and masked, as in
``triton_decode.py``, so any head size runs.

Split-KV (``ragged.plan_splits``): the packed launch's grid has one more program per split column after the
packed tiles. Program ``s`` of a tile split ``S`` ways walks keys ``[s·c, (s+1)·c)``, ``c`` the tile's keys over
``S`` rounded up to whole key tiles, writes each row's normalised partial output and log-sum-exp to a scratch
buffer and counts itself done on an atomic counter; the program that counts last merges the ``S`` partials
(``split_kv.merge_partials``' arithmetic) into the output and resets the counter. So there is no second
launch, a CUDA graph holds one kernel per layer either way, and a step of short contexts only adds split
programs that find their column empty and return. A row of a chunk may see no key of a later split's range
(its position is before it): the running maximum starts at a finite floor, not -inf, so such a row's sum stays
0 (log-sum-exp -inf, weight 0 in the merge) instead of turning into NaN.

A step's long tiles (``ragged.py``) run in a second launch, ``triton_long_tiles.long_tile_attention``
(flash-attention-2 style, issue 29; until then this kernel ran them too, one program per tile and query head).

Tests run it on the CPU under ``TRITON_INTERPRET=1`` against ``ragged_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from servelab.kernels.ragged import POS0, Q_LEN, Q_START, ROW, SPLIT, SPLITS, RaggedTiles
from servelab.kernels.split_kv import head_pad
from servelab.kernels.triton_decode import INTERPRETED
from servelab.kernels.triton_fold import fold_keys
from servelab.kernels.triton_long_tiles import long_tile_attention

KEYS_PER_ITER = 64


# the running maximum's start: exp(floor - score) is 0, and a row seeing no key stays finite (a tl.constexpr: compiled
# kernels may read no other kind of global)
NEG_FLOOR = tl.constexpr(-1.0e30)


@triton.jit
def _merge_step(PART, LSE, at, row_ok, m, den, acc, HEAD_PAD: tl.constexpr):
    """Fold one split's partial rows (``at``: their offsets in LSE) into a running log-sum-exp merge."""
    # .cg: read through L2, where the other programs' partials are, never a stale L1 line
    lse = tl.load(LSE + at, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
    offs_d = tl.arange(0, HEAD_PAD)
    part_at = PART + at[:, None] * HEAD_PAD + offs_d[None, :]
    part = tl.load(part_at, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
    m_new = tl.maximum(m, lse)
    alpha = tl.exp(m - m_new)
    w = tl.exp(lse - m_new)  # 0 for a split that saw no key of the row
    return m_new, den * alpha + w, acc * alpha[:, None] + w[:, None] * part


@triton.jit
def _partial_then_merge(
    PART,
    LSE,
    COUNT,
    acc,
    m,
    l_sum,
    first,
    split,
    splits,
    kvp,
    n_kvp,
    row_ok,
    ROWS: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Write this split's partial; the tile's last split to finish returns (True, the merged rows), the others
    (False, their own partial)."""
    rows = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_PAD)
    seen = l_sum > 0
    l_safe = tl.where(seen, l_sum, 1.0)
    part = acc / l_safe[:, None]
    at = ((first + split) * n_kvp + kvp) * ROWS + rows
    tl.store(PART + at[:, None] * HEAD_PAD + offs_d[None, :], part, mask=row_ok[:, None])
    tl.store(LSE + at, tl.where(seen, m + tl.log(l_safe), float("-inf")), mask=row_ok)
    tl.debug_barrier()  # every thread's stores precede the count that publishes them (release, GPU scope)
    done = tl.atomic_add(COUNT + first * n_kvp + kvp, 1, sem="acq_rel")
    last = done == splits - 1
    if last:
        mm = tl.full([ROWS], NEG_FLOOR, dtype=tl.float32)
        den = tl.zeros([ROWS], dtype=tl.float32)
        part = tl.zeros([ROWS, HEAD_PAD], dtype=tl.float32)
        if INTERPRETED:  # the interpreter cannot range() over a loaded value
            s = 0
            while s < splits:
                at_s = ((first + s) * n_kvp + kvp) * ROWS + rows
                mm, den, part = _merge_step(PART, LSE, at_s, row_ok, mm, den, part, HEAD_PAD)
                s += 1
        else:
            for s in range(0, splits):
                at_s = ((first + s) * n_kvp + kvp) * ROWS + rows
                mm, den, part = _merge_step(PART, LSE, at_s, row_ok, mm, den, part, HEAD_PAD)
        part = part / tl.where(den > 0, den, 1.0)[:, None]
        tl.store(COUNT + first * n_kvp + kvp, 0)  # ready for the next layer's launch, and the next replay
    return last, part


@triton.jit
def _walk(
    q, K, V, BT, lo, hi, qpos, row, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh, stride_btb,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, KEYS: tl.constexpr,
    IEEE: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Fold keys [lo, hi) of block-table row ``row``, ``KEYS`` at a time, into the rows' online softmax."""
    if INTERPRETED:  # the interpreter cannot range() over a loaded value; a while loop is the same walk
        start = lo
        while start < hi:
            m, l_sum, acc = fold_keys(
                q, K, V, BT, start, hi, qpos, row, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh,
                stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, True,
            )  # fmt: skip
            start += KEYS
    else:  # a range() loop the compiler can software-pipeline
        for start in range(lo, hi, KEYS):
            m, l_sum, acc = fold_keys(
                q, K, V, BT, start, hi, qpos, row, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh,
                stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, True,
            )  # fmt: skip
    return m, l_sum, acc


@triton.jit
def _ragged_kernel(
    Q,
    K,
    V,
    BT,
    TILES,
    SPLIT_TILES,
    PART,
    LSE,
    COUNT,
    Out,
    scale,
    n_tiles,
    stride_tiles,
    stride_split,
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
    C_SPLIT: tl.constexpr,
    C_SPLITS: tl.constexpr,
    HAS_SPLITS: tl.constexpr,
):
    pid = tl.program_id(0)
    if HAS_SPLITS:  # programs past the packed tiles are split columns
        is_split = pid >= n_tiles
        col = tl.where(is_split, pid - n_tiles, 0)
        src = tl.where(is_split, SPLIT_TILES + col, TILES + pid)
        stride = tl.where(is_split, stride_split, stride_tiles)
        q_len = tl.load(src + C_LEN * stride)
        row = tl.load(src + C_ROW * stride)
        q_start = tl.load(src + C_START * stride)
        pos0 = tl.load(src + C_POS * stride)
    else:
        q_len = tl.load(TILES + C_LEN * stride_tiles + pid)
        row = tl.load(TILES + C_ROW * stride_tiles + pid)
        q_start = tl.load(TILES + C_START * stride_tiles + pid)
        pos0 = tl.load(TILES + C_POS * stride_tiles + pid)
    if q_len == 0:
        return
    offs_m = tl.arange(0, TILE_TOKENS * GROUPS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    kvh = tl.program_id(1)  # grid axis 1 is the KV head
    t = offs_m // GROUPS_PAD
    g = offs_m % GROUPS_PAD
    row_ok = (t < q_len) & (g < GROUPS)
    head = kvh * GROUPS + g
    token = (q_start + t).to(tl.int64)
    qpos = pos0 + t
    row_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=row_mask, other=0.0)
    m = tl.full([TILE_TOKENS * GROUPS_PAD], NEG_FLOOR, dtype=tl.float32)
    l_sum = tl.zeros([TILE_TOKENS * GROUPS_PAD], dtype=tl.float32)
    acc = tl.zeros([TILE_TOKENS * GROUPS_PAD, HEAD_PAD], dtype=tl.float32)
    n_keys = pos0 + q_len
    dst = Out + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    if HAS_SPLITS:
        split = tl.load(SPLIT_TILES + C_SPLIT * stride_split + col, mask=is_split, other=0)
        splits = tl.load(SPLIT_TILES + C_SPLITS * stride_split + col, mask=is_split, other=1)
        # split s of S walks the s-th chunk of whole key tiles; a packed tile (S = 1) walks all its keys
        chunk = tl.cdiv(tl.cdiv(n_keys, splits), KEYS) * KEYS
        lo = split * chunk
        m, l_sum, acc = _walk(
            q, K, V, BT, lo, tl.minimum(lo + chunk, n_keys), qpos, row, kvh, m, l_sum, acc, scale, stride_kb,
            stride_ks, stride_kh, stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, INTERPRETED,
        )  # fmt: skip
        if is_split:
            last, merged = _partial_then_merge(
                PART, LSE, COUNT, acc, m, l_sum, col - split, split, splits, tl.program_id(1), tl.num_programs(1),
                row_ok, TILE_TOKENS * GROUPS_PAD, HEAD_PAD, INTERPRETED,
            )  # fmt: skip
            if last:
                tl.store(dst, merged.to(Out.dtype.element_ty), mask=row_mask)
        else:
            tl.store(dst, (acc / l_sum[:, None]).to(Out.dtype.element_ty), mask=row_mask)
    else:
        m, l_sum, acc = _walk(
            q, K, V, BT, 0, n_keys, qpos, row, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh, stride_btb,
            HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, INTERPRETED,
        )  # fmt: skip
        tl.store(dst, (acc / l_sum[:, None]).to(Out.dtype.element_ty), mask=row_mask)


def _check(rt: RaggedTiles, groups_pad: int) -> None:
    if rt.tile_tokens * groups_pad < 16 or rt.tile_tokens & (rt.tile_tokens - 1):
        raise ValueError(f"tile_tokens={rt.tile_tokens} must be a power of two with tile_tokens × {groups_pad} >= 16")
    if rt.long_tiles is not None and (rt.long_tile_tokens < 16 or rt.long_tile_tokens & (rt.long_tile_tokens - 1)):
        raise ValueError(f"long_tile_tokens={rt.long_tile_tokens} must be a power of two >= 16")
    if rt.split_tiles is not None and rt.split_tiles.shape[0] != 6:
        raise ValueError(f"split_tiles must have 6 rows (ragged.SPLITS + 1), got {tuple(rt.split_tiles.shape)}")


def _split_scratch(rt: RaggedTiles, q, kv_heads: int, rows: int, d_pad: int):
    """(split columns, partials [columns, KV heads, rows, d_pad], log-sum-exps, counters), or None without any."""
    cols = rt.split_tiles
    if cols is None or cols.shape[1] == 0:
        return None
    n = cols.shape[1]
    counters = rt.split_counters
    if counters is None:
        counters = torch.zeros(n * kv_heads, dtype=torch.int32, device=q.device)
    elif counters.numel() < n * kv_heads or counters.dtype != torch.int32:
        raise ValueError(f"split_counters must be int32 with >= {n * kv_heads} entries, got {counters.numel()}")
    part = torch.empty(n, kv_heads, rows, d_pad, dtype=torch.float32, device=q.device)
    lse = torch.empty(n, kv_heads, rows, dtype=torch.float32, device=q.device)
    return cols, part, lse, counters


def triton_ragged(
    q, k_pool, v_pool, rt: RaggedTiles, scale: float, *, keys: int = KEYS_PER_ITER, num_warps: int | None = None
) -> torch.Tensor:
    """Same contract as ``ragged.ragged_reference``: q [T, H, D] -> [T, H, D], rows of no tile 0. ``keys`` and
    ``num_warps`` (None: by the tile's size) set the packed launch, for benchmarks."""
    t, heads, d = q.shape
    _, block_size, kv_heads, d_k = k_pool.shape
    if d != d_k:
        raise ValueError(f"query head_dim {d} does not match the KV pool's {d_k}")
    d_pad = head_pad(d)
    groups = heads // kv_heads
    groups_pad = 1 << (groups - 1).bit_length()
    _check(rt, groups_pad)
    q = q.contiguous()
    out = torch.zeros_like(q)  # padding tokens belong to no tile; zeros keep them finite through the MLP
    split = _split_scratch(rt, q, kv_heads, rt.tile_tokens * groups_pad, d_pad)
    if rt.long_tiles is not None and rt.long_tiles.shape[1]:
        # flash-attention-2's inner loop (issue 29): 1.5-2.9x this kernel's per-head launch on a long prefill or a
        # chunk after a long context on the H100 (scripts/bench_long_tiles.py)
        long_tile_attention(q, k_pool, v_pool, rt.long_tiles, rt.block_tables, rt.long_tile_tokens, scale, out)
    tiles, tokens = rt.tiles, rt.tile_tokens
    cols, part, lse, counters = split if split is not None else (tiles, out, out, out)
    _ragged_kernel[(tiles.shape[1] + (cols.shape[1] if split is not None else 0), kv_heads)](
        q,
        k_pool,
        v_pool,
        rt.block_tables,
        tiles,
        cols,
        part,
        lse,
        counters,
        out,
        scale,
        tiles.shape[1],
        tiles.stride(0),
        cols.stride(0),
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        k_pool.stride(2),
        rt.block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUPS=groups,
        GROUPS_PAD=groups_pad,
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
        C_SPLIT=SPLIT,
        C_SPLITS=SPLITS,
        HAS_SPLITS=split is not None,
        num_warps=num_warps or (4 if d_pad * tokens * groups_pad <= 64 * 128 else 8),
    )
    return out
