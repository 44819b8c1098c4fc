"""A decode step's linear layers at a small batch, each one Triton launch with the work around it fused in.

Why: in a batch-1 decode step of Qwen2-0.5B on the H200 (the engine page's step budget), the 121 matmul launches
are busy 0.61 ms against a 0.23 ms memory floor, and 121 norm and elementwise launches add 0.19 ms. Per layer the
step runs, with Inductor fusing what it can and cuBLAS doing the matmuls:

    add + RMSNorm -> qkv matmul -> RoPE, KV write -> attention -> o matmul -> add + RMSNorm -> gate_up matmul
    -> SiLU(gate)·up -> down matmul

At one token a matmul is a matrix-vector product: it reads the weight once and does almost no arithmetic, so each
launch costs its latency more than its bytes. This module folds the elementwise work into the matmul that reads
it, so a layer's linear work is four launches, where the chain above takes seven (four matmuls, two add + RMSNorm
and one SiLU·up; the H200 budget counts five matmul-class launches a layer, and five norm and elementwise ones):

- ``norm_linear(h, delta, norm_w, eps, w, bias)``: the residual add, RMSNorm and ``x @ w.T (+ bias)``; returns the
  new residual stream too (the deferred add of the last block's output, as ``models.llama`` defers it);
- ``silu_mul_linear(gate_up, w)``: ``SiLU(gate)·up @ w.T`` from the gate_up matmul's output;
- ``linear(x, w, bias)``: a plain one (o_proj; lm_head);
- ``norm_linear_rope_kv(...)``: ``norm_linear`` for the qkv projection with RoPE and the KV-pool write in its
  epilogue (what ``kernels.rope_kv_write`` does in a launch of its own), returning the rotated q: a layer's work
  before attention in one launch. Its programs take their outputs in RoPE's pairs (lane ``d`` of a head with lane
  ``d + D/2``), so each rotates what it computed.

One program computes ``BLOCK_N`` outputs of every row (at most ``MAX_ROWS`` rows: decode at a small batch; larger
batches are matmuls, cuBLAS's job), walking the reduction ``BLOCK_K`` at a time with float32 accumulation; each
step of the walk reads its weight tile once and takes every row's product with it in turn (the rows are unrolled),
so a launch at a few rows reads what it reads at one. (The first version held a [rows, outputs, inputs] product
tile of 4,096 floats, whose reduction step shrank as rows grew: at 4 and 8 rows it ran 3 to 11 times slower than
``F.linear`` on an H100.) RMSNorm
needs the whole row's sum of squares before the first product, so with it each program reads the row twice; a
row is a few KiB and sits in L2. Every intermediate rounds to the activation dtype where the eager code rounds
(``h + delta``; RMSNorm's normalised row before the weight multiplies, as ``layers.norm.rms_norm``; SiLU(gate)
before ``· up``), so the result differs from the unfused chain only in the order of the sums.

In the engine since issue 29's item 5: ``models.small_batch`` runs a Llama/Qwen2 block through these kernels at
one row, where ``EngineConfig.small_batch`` says (on by default where ``fused_rope_kv_write`` is). The block
functions that call them need no ``torch.compile``: the kernels are the fusion Inductor would do, and the step's
CUDA graph captures them as it captures ``rope_kv_write``. ``scripts/bench_small_linear.py`` times them against the
engine's unfused chain on a GPU, and the tests check them under Triton's interpreter on a CPU.

With programmatic dependent launch (``kernels.pdl``, ``EngineConfig.pdl``) a launch reads its first weight tile
before it waits on the launch before it, so a layer's weights stream in while the previous launch drains: on an H100
it took Qwen2-0.5B's 24 layers of linear work at one row from 0.503 to 0.424 ms, the same bits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from servelab.errors import ParameterError
from servelab.kernels import pdl as pdl_launch
from servelab.kernels.rope_kv_write import INTERPRETED, _bf16_rne, _check_caches, _check_step, _store
from servelab.kernels.triton_decode import sm_count

MAX_ROWS = 8  # rows (tokens) one launch takes; beyond it the matmul's weight reuse favours a real GEMM
BLOCK_N = 4  # outputs a program by default (``launch``)
PLAIN, RMS_NORM, SILU_MUL = 0, 1, 2  # the prologue: what is computed from the input before it multiplies
STORE, ROPE_KV = 0, 1  # the epilogue: store the outputs, or rotate q and k and write k and v to the pool


@triton.jit
def _row(X, D, m, M, kk, k_ok, stride_x, stride_d, HAS_DELTA: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row ``m`` of X (+ D, rounded as eager rounds ``h + delta``) at columns ``kk``; zeros past M rows or K."""
    ok = k_ok & (tl.full([BLOCK_K], m, tl.int32) < M)
    x = tl.load(X + m * stride_x + kk, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(D + m * stride_d + kk, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
    return x, ok


@triton.jit
def _inv_rms(
    X, D, M, K, stride_x, stride_d, eps, HAS_DELTA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr
):
    """RMSNorm's 1 / rms of each row of X (+ D), over the whole row, in float32: [BLOCK_M]."""
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            x, _ = _row(X, D, m, M, kk, kk < K, stride_x, stride_d, HAS_DELTA, BLOCK_K)
            xf = x.to(tl.float32)
            squares += xf * xf
        inv_rms = tl.where(rows == m, 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps), inv_rms)
    return inv_rms


@triton.jit
def _input_row(
    X, D, H, nw, inv_rms, m, rows, pid, M, K, kk, k_ok, stride_x, stride_d, stride_h, elem: tl.constexpr,
    PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Row ``m`` of the matmul's input at columns ``kk``, the prologue applied (rounded where eager rounds)."""
    if PROLOGUE == 2:  # gate_up's output is [gate | up]: SiLU(gate) rounds, then · up rounds (as eager)
        g, _ = _row(X, X, m, M, kk, k_ok, stride_x, 0, False, BLOCK_K)
        u, _ = _row(X + K, X, m, M, kk, k_ok, stride_x, 0, False, BLOCK_K)
        g = g.to(tl.float32)
        a = ((g * tl.sigmoid(g)).to(elem).to(tl.float32) * u.to(tl.float32)).to(elem)
    elif PROLOGUE == 1:
        a, ok = _row(X, D, m, M, kk, k_ok, stride_x, stride_d, HAS_DELTA, BLOCK_K)
        if HAS_DELTA:  # one program writes the new residual stream; the others only read it
            tl.store(H + m * stride_h + kk, a, mask=ok & (tl.full([BLOCK_K], pid, tl.int32) == 0))
        inv_m = tl.sum(tl.where(rows == m, inv_rms, 0.0), axis=0)
        a = (nw * (a.to(tl.float32) * inv_m).to(elem).to(tl.float32)).to(elem)
    else:
        a, _ = _row(X, X, m, M, kk, k_ok, stride_x, 0, False, BLOCK_K)
    return a


@triton.jit
def _small_linear(
    X,
    D,
    H,
    NW,
    W,
    B,
    Y,
    PART,
    COUNT,
    COS,
    SIN,
    SLOTS,
    K_CACHE,
    V_CACHE,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    block_size,
    M,
    N,
    K,
    stride_x,
    stride_d,
    stride_h,
    stride_w,
    stride_y,
    eps,
    PROLOGUE: tl.constexpr,
    EPILOGUE: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STEPS: tl.constexpr,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    elem = Y.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)
    if EPILOGUE == 1:  # RoPE's pairs: output i is pair i // 2's lower (even i) or upper lane
        cols = _pair_columns(pid, tl.arange(0, BLOCK_N), HEAD_DIM)
    else:
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    # split s walks reduction steps [s·STEPS, (s + 1)·STEPS) (a constexpr count: the interpreter and the compiler
    # both take it); with one split that is the whole reduction. Its first weight tile is read before anything the
    # previous launch writes: with PDL this launch starts while the previous one drains, and the weights are the
    # bytes it costs (the pattern of CUTLASS's weight-prefetch example, at a GEMV's scale).
    kk_first = split * STEPS * BLOCK_K + ks
    w_first = _weight_tile(W, cols, col_ok, kk_first, K, stride_w)
    if PDL:
        tl.extra.cuda.gdc_wait()  # the previous launch has finished and its writes are visible
        tl.extra.cuda.gdc_launch_dependents()  # the next may start its own weight reads once every program is here
    if PROLOGUE == 1:  # RMSNorm needs each row's mean square before the first product
        inv_rms = _inv_rms(X, D, M, K, stride_x, stride_d, eps, HAS_DELTA, BLOCK_M, BLOCK_K)
    else:
        inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _accumulate(
        acc, w_first, X, D, H, NW, inv_rms, rows, pid, M, K, kk_first, stride_x, stride_d, stride_h, elem,
        PROLOGUE, HAS_DELTA, BLOCK_M, BLOCK_K,
    )  # fmt: skip
    for step in range(1, STEPS):
        kk = (split * STEPS + step) * BLOCK_K + ks
        acc = _accumulate(
            acc, _weight_tile(W, cols, col_ok, kk, K, stride_w), X, D, H, NW, inv_rms, rows, pid, M, K, kk,
            stride_x, stride_d, stride_h, elem, PROLOGUE, HAS_DELTA, BLOCK_M, BLOCK_K,
        )  # fmt: skip
    out_ok = (rows < M)[:, None] & col_ok[None, :]
    if SPLIT_K != 1:  # the tile's last split to finish sums every split's partial, in split order: the same sums
        last, acc = _merge_splits(PART, COUNT, acc, pid, split, rows, cols, out_ok, N, SPLIT_K, BLOCK_M)
    else:
        last = True
    if last:
        if EPILOGUE == 1:
            _rope_kv_finish(
                B, Y, acc, pid, rows, cols, col_ok, M, N, stride_y, COS, SIN, SLOTS, K_CACHE, V_CACHE,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, block_size,
                HAS_BIAS, BLOCK_N, HEADS, KV_HEADS, HEAD_DIM, RNE_BY_HAND,
            )  # fmt: skip
        else:
            _finish(B, Y, acc, rows, cols, col_ok, out_ok, stride_y, HAS_BIAS)
        if SPLIT_K != 1:
            tl.store(COUNT + pid, 0)  # ready for the next launch, and the next graph replay


@triton.jit
def _weight_tile(W, cols, col_ok, kk, K, stride_w):
    """The weight tile of outputs ``cols`` at inputs ``kk``: read once per step of the reduction, whatever the rows,
    so at a few rows the launch costs its weight bytes, as at one (a [rows, outputs, inputs] product tile would
    shrink BLOCK_K instead)."""
    return tl.load(W + cols[:, None] * stride_w + kk[None, :], mask=col_ok[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def _accumulate(
    acc, w, X, D, H, NW, inv_rms, rows, pid, M, K, kk, stride_x, stride_d, stride_h, elem: tl.constexpr,
    PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``acc`` plus every row's product with weight tile ``w`` at inputs ``kk``, the prologue applied to the rows."""
    k_ok = kk < K
    wf = w.to(tl.float32)
    nw = tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32) if PROLOGUE == 1 else wf
    for m in tl.static_range(BLOCK_M):
        a = _input_row(
            X, D, H, nw, inv_rms, m, rows, pid, M, K, kk, k_ok, stride_x, stride_d, stride_h, elem,
            PROLOGUE, HAS_DELTA, BLOCK_K,
        )  # fmt: skip
        part = tl.sum(wf * a.to(tl.float32)[None, :], axis=1)
        acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit
def _pair_columns(pid, i, HEAD_DIM: tl.constexpr):
    """The output columns of program ``pid``'s outputs ``i`` when it takes RoPE's pairs: output 2p is lane d of a
    head, 2p + 1 lane d + D/2 of the same head (pairs numbered across heads, ``D/2`` of them a head)."""
    half: tl.constexpr = HEAD_DIM // 2
    pair = pid * (i.shape[0] // 2) + i // 2
    return (pair // half) * HEAD_DIM + pair % half + (i % 2) * half


@triton.jit
def _rope_kv_finish(
    B, Q, acc, pid, rows, cols, col_ok, M, N, stride_q, COS, SIN, SLOTS, K_CACHE, V_CACHE,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, block_size,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, RNE_BY_HAND: tl.constexpr,
):  # fmt: skip
    """The qkv outputs rounded to the activation dtype (as the projection's output is), then what
    ``kernels.rope_kv_write`` does with them: q and k rotated in float32 and rounded once, q to ``Q``
    [rows, heads·D], k and v to the pool at each row's slot (``SLOTS``, flat ``block · block_size + offset``)."""
    elem = Q.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y = _rounded(acc, elem, RNE_BY_HAND)
    HALF_N: tl.constexpr = BLOCK_N // 2
    BLOCK_M: tl.constexpr = y.shape[0]
    x1, x2 = tl.split(tl.reshape(y, [BLOCK_M, HALF_N, 2]))  # each pair's lower and upper lane: [rows, pairs]
    half: tl.constexpr = HEAD_DIM // 2
    pair = pid * HALF_N + tl.arange(0, HALF_N)
    head, lane = pair // half, pair % half
    row_ok = rows < M
    ok = row_ok[:, None] & (pair < N // 2)[None, :]
    trig = rows[:, None] * HEAD_DIM + lane[None, :]  # cos and sin are [rows, D], contiguous
    cos1 = tl.load(COS + trig, mask=ok, other=0.0).to(tl.float32)
    cos2 = tl.load(COS + trig + half, mask=ok, other=0.0).to(tl.float32)
    sin1 = tl.load(SIN + trig, mask=ok, other=0.0).to(tl.float32)
    sin2 = tl.load(SIN + trig + half, mask=ok, other=0.0).to(tl.float32)
    is_q = head < HEADS
    is_v = head >= HEADS + KV_HEADS
    rotate = (~is_v)[None, :]
    # the eager order: x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1); v passes as it is
    o1 = tl.where(rotate, x1 * cos1 - x2 * sin1, x1)
    o2 = tl.where(rotate, x2 * cos2 + x1 * sin2, x2)
    q_ok = ok & is_q[None, :]
    q_at = Q + rows[:, None] * stride_q + (head * HEAD_DIM + lane)[None, :]
    _store(q_at, o1, q_ok, elem, RNE_BY_HAND)
    _store(q_at + half, o2, q_ok, elem, RNE_BY_HAND)
    slot = tl.load(SLOTS + rows, mask=row_ok, other=0).to(tl.int64)
    blk, off = slot // block_size, slot % block_size
    k_ok = ok & (~is_q & ~is_v)[None, :]
    k_at = K_CACHE + blk[:, None] * stride_kb + off[:, None] * stride_ks + ((head - HEADS) * stride_kh + lane)[None, :]
    _store(k_at, o1, k_ok, K_CACHE.dtype.element_ty, RNE_BY_HAND)
    _store(k_at + half, o2, k_ok, K_CACHE.dtype.element_ty, RNE_BY_HAND)
    v_ok = ok & is_v[None, :]
    v_head = head - HEADS - KV_HEADS
    v_at = V_CACHE + blk[:, None] * stride_vb + off[:, None] * stride_vs + (v_head * stride_vh + lane)[None, :]
    _store(v_at, o1, v_ok, V_CACHE.dtype.element_ty, RNE_BY_HAND)
    _store(v_at + half, o2, v_ok, V_CACHE.dtype.element_ty, RNE_BY_HAND)


@triton.jit
def _rounded(x, elem: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """float32 ``x`` rounded to ``elem`` to nearest even (as the projection's output is stored), back in float32:
    the rounding ``rope_kv_write._store`` does before it stores."""
    if RNE_BY_HAND and elem == tl.bfloat16:
        return _bf16_rne(x)
    return x.to(elem).to(tl.float32)


@triton.jit
def _finish(B, Y, acc, rows, cols, col_ok, out_ok, stride_y, HAS_BIAS: tl.constexpr):
    """The bias, then the outputs in the activation dtype."""
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], acc.to(Y.dtype.element_ty), mask=out_ok)


@triton.jit
def _merge_splits(
    PART, COUNT, acc, pid, split, rows, cols, out_ok, N, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr
):  # fmt: skip
    """Write this split's partial [BLOCK_M, BLOCK_N] to PART [SPLIT_K, BLOCK_M, N] (float32) and count it in; the
    last of the tile's splits gets (True, the sum of all of them in split order), the others (False, their own)."""
    at = rows[:, None] * N + cols[None, :]
    tl.store(PART + split * BLOCK_M * N + at, acc, mask=out_ok)
    tl.debug_barrier()  # every thread's stores precede the count that publishes them (release, GPU scope)
    done = tl.atomic_add(COUNT + pid, 1, sem="acq_rel")
    last = done == SPLIT_K - 1
    total = tl.zeros_like(acc)
    if last:
        for s in tl.static_range(SPLIT_K):  # .cg: through L2, where the other programs' partials are
            total += tl.load(PART + s * BLOCK_M * N + at, mask=out_ok, other=0.0, cache_modifier=".cg")
    return last, total


_COUNTERS: dict[tuple, torch.Tensor] = {}  # (device, tiles) -> the split-K arrival counts, zero between launches


def _counters(device, tiles: int) -> torch.Tensor:
    """Arrival counts for ``tiles`` output tiles: zeroed once, and each launch's merging split sets its tile's back
    to 0, so a launch needs no memset of its own and a captured graph replays with the same buffer (kept here for
    the process, as a graph must). Launches on one stream run in order, so one buffer serves them all."""
    key = (torch.device(device), tiles)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(tiles, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def launch(rows: int, n: int, k: int, block_n: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): every row in one program; ``BLOCK_N`` outputs a program, 4 unless ``block_n``
    is given, which on an H100 was the fastest launch at one row for all eight of the Qwen2-0.5B and Llama-3-8B
    shapes' matrices (``data/dev/nvidia-h100/2026-12-05/small_linear.csv``: 896 outputs are 224 programs, more than
    the SMs); a weight tile of at most 4,096 elements per program."""
    block_m = triton.next_power_of_2(rows)
    block_n = block_n or BLOCK_N
    block_k = max(16, min(triton.next_power_of_2(k), 4096 // block_n))
    return block_m, block_n, block_k


def default_split(tiles: int, steps: int, device) -> int:
    """Splits of the reduction by default: one per reduction step where the output tiles are under two per SM, else
    none. On an H100 at one row (``data/dev/nvidia-h100/2026-12-06/small_linear_split_*.csv``) this split
    Qwen2-0.5B's down (224 tiles, 5 steps: 0.208 -> 0.151 ms over 24 launches, ``F.linear`` 0.181) and left
    Llama-3-8B's alone (1,024 tiles a matrix or more), whose matrices gain nothing from a split; on a CPU, none."""
    sms = sm_count(device)
    return steps if sms is not None and steps > 1 and tiles < 2 * sms else 1


def _check(x: torch.Tensor, w: torch.Tensor, k: int, what: str) -> None:
    if x.dim() != 2 or w.dim() != 2:
        raise ParameterError(f"{what}: input and weight must be 2-D, got {tuple(x.shape)} and {tuple(w.shape)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ParameterError(f"{what}: takes 1 to {MAX_ROWS} rows (a decode at a small batch), got {x.shape[0]}")
    if w.shape[1] != k:
        raise ParameterError(f"{what}: weight {tuple(w.shape)} does not take {k} inputs")
    if x.dtype != w.dtype:
        raise ParameterError(f"{what}: input is {x.dtype}, weight {w.dtype}")
    if x.stride(-1) != 1 or not w.is_contiguous():
        raise ParameterError(f"{what}: the input's rows and the weight must be contiguous")


class RopeKV(NamedTuple):
    """What ``norm_linear_rope_kv``'s epilogue needs: the step's cos and sin ([T, D] or [T, 1, D]), each row's pool
    slot, one layer's K and V pools ([num_blocks, block_size, kv_heads, D]) and the head counts."""

    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int


def _run(
    prologue, x, w, bias=None, delta=None, h_out=None, norm_w=None, eps=0.0, k=None, block_n=None, num_warps=4,
    split_k=None, rope: RopeKV | None = None, pdl=None,
):  # fmt: skip
    m, n, k = x.shape[0], w.shape[0], k or x.shape[1]
    pdl = pdl_launch.wanted(x.device, pdl)
    if rope is None:
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:  # the rotated q only: k and v go to the pool
        y = torch.empty(m, rope.heads * rope.head_dim, dtype=x.dtype, device=x.device)
        if block_n is not None and block_n % 2:
            raise ParameterError(f"block_n must be even with RoPE's pairs, got {block_n}")
    bm, bn, bk = launch(m, n, k, block_n)
    steps, tiles = triton.cdiv(k, bk), triton.cdiv(n, bn)
    if split_k is None:
        split_k = default_split(tiles, steps, x.device)
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ParameterError(f"split_k must be a positive integer, got {split_k!r}")
    split_k = min(split_k, steps)  # a split with no reduction step of its own would only add a partial of zeros
    part = torch.empty(split_k, bm, n, dtype=torch.float32, device=x.device) if split_k > 1 else y
    count = _counters(x.device, tiles) if split_k > 1 else y
    if rope is not None:
        cos, sin = (t.reshape(m, rope.head_dim) for t in (rope.cos, rope.sin))
        pools = (rope.slots, rope.k_cache, rope.v_cache, *rope.k_cache.stride()[:3], *rope.v_cache.stride()[:3])
        heads = (rope.heads, rope.kv_heads, rope.head_dim)
        pools += (rope.k_cache.shape[1],)
    else:
        cos = sin = x
        pools, heads = (x, x, x, 0, 0, 0, 0, 0, 0, 1), (1, 1, 2)
    _small_linear[(tiles, split_k)](
        x,
        delta if delta is not None else x,
        h_out if h_out is not None else x,
        norm_w if norm_w is not None else x,
        w,
        bias if bias is not None else x,
        y,
        part,
        count,
        cos,
        sin,
        *pools,
        m,
        n,
        k,
        x.stride(0),
        delta.stride(0) if delta is not None else 0,
        h_out.stride(0) if h_out is not None else 0,
        w.stride(0),
        y.stride(0),
        eps,
        PROLOGUE=prologue,
        EPILOGUE=ROPE_KV if rope is not None else STORE,
        HAS_DELTA=delta is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SPLIT_K=split_k,
        STEPS=triton.cdiv(steps, split_k),
        HEADS=heads[0],
        KV_HEADS=heads[1],
        HEAD_DIM=heads[2],
        RNE_BY_HAND=INTERPRETED,
        PDL=pdl,
        num_warps=num_warps,
        **pdl_launch.launch_kw(pdl),
    )
    return y


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, **launch_kw) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for ``x`` [M ≤ MAX_ROWS, K], ``w`` [N, K]. ``launch_kw``, in every function here:
    ``block_n`` (outputs per program, ``launch``'s choice by default), ``num_warps`` (4) and ``split_k``
    (``default_split``'s choice by default):
    programs per output tile, each over its share of the reduction, for a matrix with few outputs and many inputs
    (Qwen2-0.5B's down, 896 × 4,864, ran at 2.6× its floor on an H100 with the outputs alone split); the tile's
    last split to finish adds the partials in split order, so the result is the same every run; and ``pdl``
    (programmatic dependent launch, ``kernels.pdl``: the calling context's choice by default)."""
    _check(x, w, x.shape[-1], "linear")
    return _run(PLAIN, x, w, bias, **launch_kw)


def norm_linear(
    h: torch.Tensor,
    delta: torch.Tensor | None,
    norm_w: torch.Tensor,
    eps: float,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    **launch_kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h (+ delta)`` -> (the residual stream ``h + delta``, ``rms_norm(h + delta) @ w.T (+ bias)``)."""
    _check(h, w, h.shape[-1], "norm_linear")
    if delta is not None and (delta.shape != h.shape or delta.dtype != h.dtype or delta.stride(-1) != 1):
        raise ParameterError(f"norm_linear: delta {tuple(delta.shape)} {delta.dtype} does not match h {tuple(h.shape)}")
    if norm_w.shape != (h.shape[-1],):
        raise ParameterError(f"norm_linear: norm weight {tuple(norm_w.shape)} for rows of {h.shape[-1]}")
    h_out = torch.empty_like(h) if delta is not None else None
    y = _run(RMS_NORM, h, w, bias, delta=delta, h_out=h_out, norm_w=norm_w, eps=eps, **launch_kw)
    return (h if h_out is None else h_out), y


def silu_mul_linear(gate_up: torch.Tensor, w: torch.Tensor, **launch_kw) -> torch.Tensor:
    """``(SiLU(gate) · up) @ w.T`` where ``gate_up`` [M, 2I] is ``[gate | up]`` and ``w`` is [N, I]."""
    if gate_up.dim() != 2 or gate_up.shape[-1] % 2:
        raise ParameterError(f"silu_mul_linear: gate_up must be [rows, 2·I], got {tuple(gate_up.shape)}")
    half = gate_up.shape[-1] // 2
    _check(gate_up, w, half, "silu_mul_linear")
    return _run(SILU_MUL, gate_up, w, k=half, **launch_kw)


def norm_linear_rope_kv(
    h: torch.Tensor,
    delta: torch.Tensor | None,
    norm_w: torch.Tensor,
    eps: float,
    qkv_w: torch.Tensor,
    qkv_b: torch.Tensor | None,
    rope: RopeKV,
    **launch_kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm_linear`` for a layer's qkv projection, then RoPE and the pool write in the same launch:
    ``h (+ delta)`` -> (the residual stream ``h + delta``, q rotated [T, heads, head_dim]); the rotated k and v land
    in ``rope.k_cache`` / ``rope.v_cache`` at ``rope.slots``, as ``kernels.rope_kv_write`` puts them. Slots are not
    range-checked (that would cost a host synchronisation): the block manager owns them."""
    _check(h, qkv_w, h.shape[-1], "norm_linear_rope_kv")
    t = h.shape[0]
    qkv_shape = torch.empty(t, qkv_w.shape[0], device="meta")  # the projection's output, for the RoPE checks
    _check_step(qkv_shape, rope.cos, rope.sin, rope.slots, rope.heads, rope.kv_heads, rope.head_dim)
    _check_caches(rope.k_cache, rope.v_cache, rope.kv_heads, rope.head_dim)
    if delta is not None and (delta.shape != h.shape or delta.dtype != h.dtype or delta.stride(-1) != 1):
        raise ParameterError(
            f"norm_linear_rope_kv: delta {tuple(delta.shape)} {delta.dtype} does not match h {tuple(h.shape)}"
        )
    if norm_w.shape != (h.shape[-1],):
        raise ParameterError(f"norm_linear_rope_kv: norm weight {tuple(norm_w.shape)} for rows of {h.shape[-1]}")
    h_out = torch.empty_like(h) if delta is not None else None
    q = _run(RMS_NORM, h, qkv_w, qkv_b, delta=delta, h_out=h_out, norm_w=norm_w, eps=eps, rope=rope, **launch_kw)
    return (h if h_out is None else h_out), q.view(t, rope.heads, rope.head_dim)
