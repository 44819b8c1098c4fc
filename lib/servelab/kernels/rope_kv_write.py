"""Rotary embedding and the KV-cache write in one Triton kernel: qkv projection output in, rotated q out.

Unfused, a layer applies RoPE to q and k (one kernel when Inductor fuses it, a dozen eager) and then writes K
and V into the pool with an ``index_copy_`` (another kernel). Here one program per token reads its row of the
qkv projection ``[(H + 2·H_kv)·D]`` (bias already added by the matmul), rotates q and k with the step's cos/sin
(HF's ``rotate_half`` convention: lane ``d`` of the first half pairs with lane ``d + D/2``), stores q, and
stores the rotated k and the untouched v at the token's pool slot: one launch per layer.

The arithmetic is float32 whatever the activation dtype, rounded once on store (to nearest even), as
Inductor's fused RoPE does: in float32 it is bitwise the eager path's ``q·cos + rotate_half(q)·sin`` (each
product rounded, then summed: the launch turns FMA contraction off, so a GPU rounds as the interpreter does).
Any even head size: the half-head axis is padded to a power of two and masked, as are the head axes (14
query heads run as 16 lanes).

No host synchronisation and shapes fixed by the step's token count, so a CUDA graph captures it. Padding
tokens of a captured step all write the scratch slot; which of them lands last does not matter.

Tests run it on the CPU under ``TRITON_INTERPRET=1`` against ``apply_rotary`` + ``KVPool.write``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from servelab.errors import ParameterError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# no FMA contraction: a GPU rounds each product as eager PyTorch (and the interpreter) do
COMPILE_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _bf16_rne(x):
    """float32 ``x`` rounded to bfloat16's nearest even value, still in float32 (exact in bfloat16): by hand, since
    the interpreter truncates float32 -> bfloat16 (whatever fp_downcast_rounding says)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store(ptr, x, mask, elem: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """Store float32 ``x`` as ``elem``, rounded to nearest even (as ``Tensor.to`` and a GPU's cast round)."""
    if RNE_BY_HAND and elem == tl.bfloat16:
        x = _bf16_rne(x)  # the cast below then drops zeros
    tl.store(ptr, x.to(elem), mask=mask)


@triton.jit
def _rotate_store(
    X,
    OUT,
    cos1,
    cos2,
    sin1,
    sin2,
    heads_off,
    heads_mask,
    out_head_stride,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
):
    """RoPE on rows ``heads_off`` of X (each a head of ``HEAD_DIM`` lanes); rotated rows to OUT."""
    half = HEAD_DIM // 2
    lanes = tl.arange(0, HALF_PAD)
    mask = heads_mask[:, None] & (lanes < half)[None, :]
    src = X + heads_off[:, None] * HEAD_DIM + lanes[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    # the eager order: x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1); each product rounded, then summed
    o1 = x1 * cos1[None, :] - x2 * sin1[None, :]
    o2 = x2 * cos2[None, :] + x1 * sin2[None, :]
    dst = OUT + heads_off[:, None] * out_head_stride + lanes[None, :]
    _store(dst, o1, mask, OUT.dtype.element_ty, RNE_BY_HAND)
    _store(dst + half, o2, mask, OUT.dtype.element_ty, RNE_BY_HAND)


@triton.jit
def _rope_kv_write_kernel(
    QKV,
    COS,
    SIN,
    SLOTS,
    Q_OUT,
    K_CACHE,
    V_CACHE,
    stride_qkv_t,
    stride_cos_t,
    stride_sin_t,
    stride_q_t,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_SIZE,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    RNE_BY_HAND: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half = HEAD_DIM // 2
    lanes = tl.arange(0, HALF_PAD)
    lane_ok = lanes < half
    cos1 = tl.load(COS + t * stride_cos_t + lanes, mask=lane_ok, other=0.0).to(tl.float32)
    cos2 = tl.load(COS + t * stride_cos_t + half + lanes, mask=lane_ok, other=0.0).to(tl.float32)
    sin1 = tl.load(SIN + t * stride_sin_t + lanes, mask=lane_ok, other=0.0).to(tl.float32)
    sin2 = tl.load(SIN + t * stride_sin_t + half + lanes, mask=lane_ok, other=0.0).to(tl.float32)
    row = QKV + t * stride_qkv_t

    qh = tl.arange(0, HEADS_PAD)
    q_dst = Q_OUT + t * stride_q_t
    _rotate_store(row, q_dst, cos1, cos2, sin1, sin2, qh, qh < HEADS, HEAD_DIM, HEAD_DIM, HALF_PAD, RNE_BY_HAND)

    slot = tl.load(SLOTS + t).to(tl.int64)
    blk, off = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    kh = tl.arange(0, KV_HEADS_PAD)
    kh_ok = kh < KV_HEADS
    k_row = row + HEADS * HEAD_DIM
    k_dst = K_CACHE + blk * stride_kb + off * stride_ks
    _rotate_store(k_row, k_dst, cos1, cos2, sin1, sin2, kh, kh_ok, stride_kh, HEAD_DIM, HALF_PAD, RNE_BY_HAND)

    # V is copied as it is (cast to the pool's dtype), both halves of each head
    v_mask = kh_ok[:, None] & lane_ok[None, :]
    v_src = row + (HEADS + KV_HEADS) * HEAD_DIM + kh[:, None] * HEAD_DIM + lanes[None, :]
    v_dst = V_CACHE + blk * stride_vb + off * stride_vs + kh[:, None] * stride_vh + lanes[None, :]
    for h0 in tl.static_range(2):
        v = tl.load(v_src + h0 * half, mask=v_mask, other=0.0).to(tl.float32)  # exact: float32 holds any input
        _store(v_dst + h0 * half, v, v_mask, V_CACHE.dtype.element_ty, RNE_BY_HAND)


def rope_kv_write(qkv, cos, sin, slots, k_cache, v_cache, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """RoPE on q and k of ``qkv`` [T, (heads + 2·kv_heads)·head_dim], rotated k and v written to ``k_cache`` and
    ``v_cache`` (one layer's pool, each [num_blocks, block_size, kv_heads, head_dim]) at ``slots`` (LongTensor [T],
    flat ``block · block_size + offset``); returns q [T, heads, head_dim] in ``qkv``'s dtype.

    ``cos``/``sin``: [T, head_dim] or [T, 1, head_dim], as ``RotaryEmbedding`` returns them (any float dtype).
    Slots are not range-checked (that would cost a host synchronisation): the block manager owns them.
    """
    _check(qkv, cos, sin, slots, k_cache, v_cache, heads, kv_heads, head_dim)
    t = qkv.shape[0]
    q = torch.empty(t, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    cos, sin = cos.reshape(t, head_dim), sin.reshape(t, head_dim)
    _rope_kv_write_kernel[(t,)](
        qkv, cos, sin, slots, q, k_cache, v_cache,
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        k_cache.shape[1],
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(heads), KV_HEADS_PAD=triton.next_power_of_2(kv_heads),
        HALF_PAD=triton.next_power_of_2(head_dim // 2), RNE_BY_HAND=INTERPRETED,
        num_warps=1 if heads * head_dim <= 2048 else 4,
        **COMPILE_OPTIONS,
    )  # fmt: skip
    return q


def _check(qkv, cos, sin, slots, k_cache, v_cache, heads: int, kv_heads: int, head_dim: int) -> None:
    """Shapes and layouts the kernel's addressing assumes (no values: those would sync the host)."""
    _check_step(qkv, cos, sin, slots, heads, kv_heads, head_dim)
    _check_caches(k_cache, v_cache, kv_heads, head_dim)
    devices = {x.device for x in (qkv, cos, sin, slots, k_cache, v_cache)}
    if len(devices) != 1:
        raise ParameterError(f"every tensor must be on one device, got {sorted(map(str, devices))}")


def _check_step(qkv, cos, sin, slots, heads: int, kv_heads: int, head_dim: int) -> None:
    if head_dim < 2 or head_dim % 2:
        raise ParameterError(f"RoPE needs an even head_dim, got {head_dim}")
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ParameterError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    width = (heads + 2 * kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1:
        raise ParameterError(f"qkv must be [T, {width}] with unit last stride, got {tuple(qkv.shape)}")
    t = qkv.shape[0]
    for name, x in (("cos", cos), ("sin", sin)):
        if x.numel() != t * head_dim or x.shape[0] != t or x.shape[-1] != head_dim or not x.is_contiguous():
            raise ParameterError(f"{name} must be contiguous [{t}, (1,) {head_dim}], got {tuple(x.shape)}")
    if slots.shape != (t,) or slots.dtype not in (torch.int32, torch.int64):
        raise ParameterError(f"slots must be an integer tensor [{t}], got {slots.dtype} {tuple(slots.shape)}")


def _check_caches(k_cache, v_cache, kv_heads: int, head_dim: int) -> None:
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or tuple(c.shape[2:]) != (kv_heads, head_dim) or c.stride(3) != 1:
            raise ParameterError(
                f"{name} must be [blocks, block_size, {kv_heads}, {head_dim}] with unit last stride, "
                f"got {tuple(c.shape)}"
            )
    if k_cache.shape[:2] != v_cache.shape[:2]:
        raise ParameterError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")


def runs_here(device) -> bool:
    """Whether the kernel runs for tensors on ``device``: CUDA, or any device under Triton's interpreter."""
    return INTERPRETED or torch.device(device).type == "cuda"
