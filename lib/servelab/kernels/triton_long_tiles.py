"""Long-tile prefill attention in Triton, flash-attention-2 style: ``triton_ragged``'s launch for a step's long tiles.

Why: ``triton_ragged`` ran a step's long tiles (runs of at least ``long_tile_tokens`` tokens, ``ragged.py``) with the
same inner step as its packed tiles (``triton_fold.fold_keys``): the causal mask on every key tile, ``tl.exp`` with
the scale multiplied into each score, 64 keys and 4 warps per program. On the H200, at Qwen2-0.5B's shape (14 query
heads, 2 KV heads, head_dim 64, bf16), a 4096-token prefill step spends 7.4 ms of its 14.3 ms in attention against a
FLOP floor of 0.91 ms (8x the floor), and a mixed step (decodes + a 512-token chunk after ~2,400 cached tokens)
3.6 of its 5.4 ms (``data/results/nvidia-h200/engine/step_budget.csv``). Flash-attention-2-style kernels reach 2-3x
their floor, so the long-tile path is the biggest cut the step budget points to.

What: ``long_tile_attention`` has the contract of the long-tile launch inside ``triton_ragged``: the same tile table
(rows ``ROW``, ``Q_START``, ``Q_LEN``, ``POS0``), one program per (long tile, query head), a row's keys read through
its sequence's block table from the paged pool ``[blocks, block_size, kv_heads, head_dim]``, KV head = head // groups,
only its tiles' rows written, empty tiles (``Q_LEN`` 0) returning at once so the grid stays fixed for CUDA graphs,
any head size through a power-of-two padded head axis (``split_kv.head_pad``), float32 dot products exact
(``input_precision="ieee"``). Inside, the FA2 techniques:

- the softmax runs in base 2: ``exp2`` with ``scale · log2(e)`` applied to each score in the same fused
  multiply-add that subtracts the row maximum (so scaling costs no extra instruction, and bf16 q is not rounded
  a second time, as folding the scale into q would do);
- the key walk is cut in two: keys every row of the tile sees (positions up to the tile's first position, rounded
  down to whole key tiles) walk with no mask at all, and only the few diagonal key tiles after them pay for the
  causal mask;
- keys per iteration (``block_n``), warps and pipeline stages are launch parameters (``default_launch`` picks
  H100/H200 values; ``scripts/bench_long_tiles.py`` sweeps them);
- program order: the grid's fastest axis is the query head and its tiles run last-first, so the tiles late in a
  prompt, which read the most keys, start in the first wave and the short ones fill the tail.

``triton_ragged`` calls this for its long tiles since issue 29: on the H100 it took a 4,096-token prefill's or a long
chunk's attention 1.5-2.9x faster (``scripts/gpu_dev.sh long-tiles``). Tests run it on the CPU under
``TRITON_INTERPRET=1`` against ``ragged.ragged_reference`` (``tests/test_long_tile_attention.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from servelab.kernels.ragged import POS0, Q_LEN, Q_START, ROW
from servelab.kernels.split_kv import head_pad
from servelab.kernels.triton_decode import INTERPRETED

LOG2E = 1.4426950408889634
# the running maximum's start: exp2(floor - score) is 0 and stays finite (a constexpr: compiled kernels read no
# other kind of global)
NEG_FLOOR = tl.constexpr(-1.0e30)


def default_launch(head_dim: int, long_tile_tokens: int, elem_bytes: int = 2) -> tuple[int, int, int]:
    """(keys per iteration, warps, pipeline stages) for H100/H200: 128 keys, 8 warps (two warpgroups of 64 query
    rows each) and 3 stages of K/V in shared memory for 128-row tiles; 64 keys and 4 warps for smaller tiles.

    From the H100 sweep (``data/dev/nvidia-h100/2026-12-06/long_tiles_949817b.csv``): over a 4,096-token prefill
    and a 512-token chunk after 2,048 keys at both model shapes, 128 keys / 8 warps / 3 stages is the fastest at
    3 of the 4 points and 1.17x the fastest at the fourth (0.5B prefill); the first default, 64 keys / 8 warps,
    was 1.03-1.34x the fastest (1.14x over the four, against 1.04x).

    Shared memory holds the q tile, the K and V tiles and the probabilities, ``elem_bytes x (tokens x head_pad +
    2 x keys x head_pad + tokens x keys)``, which must fit 232,448 bytes (sm90's limit); the pipeline's stages add
    little (an H100 asked 263,168 bytes with 3 and 262,144 with 2 for float32 at head_dim 80 and 128 keys, the
    formula's 262,144). So the keys halve until the tiles fit, and rows over 256 bytes take 2 stages."""
    row = head_pad(head_dim) * elem_bytes  # bytes of one key's (or value's) row in a tile
    keys = 128 if long_tile_tokens >= 128 else 64
    while keys > 16 and shared_bytes(head_dim, long_tile_tokens, keys, elem_bytes) > SHARED_LIMIT:
        keys //= 2
    return keys, (8 if long_tile_tokens >= 128 else 4), (3 if row <= 256 else 2)


SHARED_LIMIT = 232_448  # bytes of shared memory a block may take on sm90 (H100, H200)


def shared_bytes(head_dim: int, long_tile_tokens: int, keys: int, elem_bytes: int) -> int:
    """The long-tile program's shared memory at a launch: its q tile, K and V tiles and probabilities."""
    hp = head_pad(head_dim)
    return elem_bytes * (long_tile_tokens * hp + 2 * keys * hp + long_tile_tokens * keys)


@triton.jit
def _fold(
    q, K, V, BT, start, end, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh, stride_btb,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Fold keys [start, start + BLOCK_N) into every row's running (max, sum, accumulator), all in base 2. MASKED:
    keys at or past ``end``, or after a row's position, are hidden; unmasked: every key is visible to every row
    (the caller guarantees it), so neither the loads nor the scores carry a mask."""
    offs_d = tl.arange(0, HEAD_PAD)
    pos = start + tl.arange(0, BLOCK_N)
    if MASKED:
        ok = pos < end
        blk = tl.load(BT + row * stride_btb + pos // BLOCK_SIZE, mask=ok, other=0)
        kv_mask = ok[:, None] if HEAD_DIM == HEAD_PAD else ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    else:  # the padded head lanes' mask only (none at a power-of-two head, below)
        blk = tl.load(BT + row * stride_btb + pos // BLOCK_SIZE)
        kv_mask = tl.broadcast_to(offs_d[None, :] < HEAD_DIM, (BLOCK_N, HEAD_PAD))
    base = blk.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kvh * stride_kh
    kv_at = base[:, None] + offs_d[None, :]
    if MASKED or HEAD_DIM != HEAD_PAD:
        k = tl.load(K + kv_at, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_at, mask=kv_mask, other=0.0)
    else:  # whole key tiles at a power-of-two head: plain loads, nothing to predicate
        k = tl.load(K + kv_at)
        v = tl.load(V + kv_at)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") if IEEE else tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(ok[None, :] & (pos[None, :] <= qpos[:, None]), s, float("-inf"))
    # qk_scale > 0, so scaling the row's max is scaling its scores' max: one multiply per row, not per score
    m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
    # one fused multiply-add per score: the scale and the max subtraction together, then the base-2 exponential
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l_sum = l_sum * alpha + tl.sum(p, 1)
    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee") if IEEE else tl.dot(p.to(v.dtype), v)
    return m_new, l_sum, acc * alpha[:, None] + pv


@triton.jit
def _walk(
    q, K, V, BT, lo, hi, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh, stride_btb,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr, MASKED: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Fold keys [lo, hi), ``BLOCK_N`` at a time."""
    if INTERPRETED:  # the interpreter cannot range() over a loaded value; a while loop is the same walk
        start = lo
        while start < hi:
            m, l_sum, acc = _fold(
                q, K, V, BT, start, hi, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh,
                stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, BLOCK_N, IEEE, MASKED,
            )  # fmt: skip
            start += BLOCK_N
    else:  # a range() loop the compiler software-pipelines over num_stages
        for start in range(lo, hi, BLOCK_N):
            m, l_sum, acc = _fold(
                q, K, V, BT, start, hi, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh,
                stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, BLOCK_N, IEEE, MASKED,
            )  # fmt: skip
    return m, l_sum, acc


# the tile table's width and strides change with the step's graph size (or from eager step to eager step):
# without this, Triton would compile a new variant (divisible by 16 or not) in the middle of a run
@triton.jit(do_not_specialize=["n_tiles", "stride_tiles", "stride_btb"])
def _long_tile_kernel(
    Q, K, V, BT, TILES, Out, qk_scale, n_tiles, stride_tiles, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_btb, stride_ot, stride_oh,
    GROUPS: tl.constexpr, TILE_TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, INTERPRETED: tl.constexpr,
    C_ROW: tl.constexpr, C_START: tl.constexpr, C_LEN: tl.constexpr, C_POS: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(0)
    # last tile first: a run's tiles are planned in position order, so the late ones (most keys) start in the first
    # wave; the head is the fastest grid axis, so a tile's heads (sharing K/V through L2) run side by side
    tile = n_tiles - 1 - tl.program_id(1)
    q_len = tl.load(TILES + C_LEN * stride_tiles + tile)
    if q_len == 0:  # padding: the grid is fixed, the step's mix is not
        return
    row = tl.load(TILES + C_ROW * stride_tiles + tile)
    q_start = tl.load(TILES + C_START * stride_tiles + tile)
    pos0 = tl.load(TILES + C_POS * stride_tiles + tile)
    kvh = head // GROUPS
    t = tl.arange(0, TILE_TOKENS)
    offs_d = tl.arange(0, HEAD_PAD)
    row_ok = t < q_len
    token = (q_start + t).to(tl.int64)
    qpos = pos0 + t
    row_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + token[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=row_mask, other=0.0)
    m = tl.full([TILE_TOKENS], NEG_FLOOR, dtype=tl.float32)
    l_sum = tl.zeros([TILE_TOKENS], dtype=tl.float32)
    acc = tl.zeros([TILE_TOKENS, HEAD_PAD], dtype=tl.float32)
    n_keys = pos0 + q_len
    # keys every row sees: positions <= pos0 (the first row's), rounded down to whole key tiles, so no mask at all
    n_full = ((pos0 + 1) // BLOCK_N) * BLOCK_N
    m, l_sum, acc = _walk(
        q, K, V, BT, 0, n_full, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh,
        stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, BLOCK_N, IEEE, False, INTERPRETED,
    )  # fmt: skip
    # the diagonal: at most ceil((TILE_TOKENS + BLOCK_N - 1) / BLOCK_N) key tiles, causal mask and end bound
    m, l_sum, acc = _walk(
        q, K, V, BT, n_full, n_keys, qpos, row, kvh, m, l_sum, acc, qk_scale, stride_kb, stride_ks, stride_kh,
        stride_btb, HEAD_DIM, HEAD_PAD, BLOCK_SIZE, BLOCK_N, IEEE, True, INTERPRETED,
    )  # fmt: skip
    dst = Out + token[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    # every valid row saw key 0, so l_sum > 0; padded rows (past q_len) are not stored
    tl.store(dst, (acc / l_sum[:, None]).to(Out.dtype.element_ty), mask=row_mask)


def _power_of_two(name: str, value: int) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name}={value} must be a power of two >= 16 (tl.arange and tl.dot need both)")


def _check(q, k_pool, v_pool, long_tiles, block_tables, long_tile_tokens: int, block_n: int, out) -> None:
    _power_of_two("long_tile_tokens", long_tile_tokens)
    _power_of_two("block_n", block_n)
    if q.dim() != 3 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape:
        shapes = f"{tuple(q.shape)}, {tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        raise ValueError(f"need q [T, H, D] and pools [blocks, block_size, kv_heads, D], got {shapes}")
    if q.shape[2] != k_pool.shape[3]:
        raise ValueError(f"query head_dim {q.shape[2]} does not match the KV pool's {k_pool.shape[3]}")
    if q.shape[1] % k_pool.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_pool.shape[2]} KV heads")
    if long_tiles.dim() != 2 or long_tiles.shape[0] != 4:
        raise ValueError(f"long_tiles must be [4, max_long_tiles] (ragged.ROW..POS0), got {tuple(long_tiles.shape)}")
    if k_pool.stride(3) != 1 or v_pool.stride() != k_pool.stride():
        raise ValueError("the K and V pools must share strides with a contiguous head axis")
    if out is not None and (out.shape != q.shape or out.stride(2) != 1):
        raise ValueError(f"out must be q's shape {tuple(q.shape)} with a contiguous head axis")


def long_tile_attention(
    q,
    k_pool,
    v_pool,
    long_tiles: torch.Tensor,
    block_tables: torch.Tensor,
    long_tile_tokens: int,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """The long tiles of a step: q [T, H, D] -> ``out`` [T, H, D] (None: zeros), only the tiles' rows written.

    ``long_tiles`` [4, max_long_tiles] (rows ``ragged.ROW``..``POS0``, empty tiles 0 tokens) and ``block_tables``
    as in ``ragged.RaggedTiles``; ``block_n``, ``num_warps``, ``num_stages``: None takes ``default_launch``'s."""
    d = q.shape[-1]
    default = default_launch(d, long_tile_tokens, q.element_size())
    block_n = block_n or default[0]
    _check(q, k_pool, v_pool, long_tiles, block_tables, long_tile_tokens, block_n, out)
    heads, block_size, kv_heads = q.shape[1], k_pool.shape[1], k_pool.shape[2]
    q = q.contiguous()
    if out is None:
        out = torch.zeros_like(q)  # rows of no long tile: zeros, as triton_ragged's
    n_tiles = long_tiles.shape[1]
    if n_tiles == 0:
        return out
    _long_tile_kernel[(heads, n_tiles)](
        q, k_pool, v_pool, block_tables, long_tiles, out, scale * LOG2E, n_tiles, long_tiles.stride(0),
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUPS=heads // kv_heads, TILE_TOKENS=long_tile_tokens, HEAD_DIM=d, HEAD_PAD=head_pad(d),
        BLOCK_SIZE=block_size, BLOCK_N=block_n, IEEE=q.dtype == torch.float32, INTERPRETED=INTERPRETED,
        C_ROW=ROW, C_START=Q_START, C_LEN=Q_LEN, C_POS=POS0,
        num_warps=num_warps or default[1], num_stages=num_stages or default[2],
    )  # fmt: skip
    return out
