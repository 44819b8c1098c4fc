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
def _attend_tile(
    q,
    K,
    V,
    BT,
    start,
    length,
    b,
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
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
):
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


# the block-table stride is the step's table width, which varies from eager step to eager step: without
# this, Triton would compile a new variant (divisible by 16 or not, equal to 1) in the middle of a run
@triton.jit(do_not_specialize=["stride_btb"])
def _paged_decode_kernel(
    Q,
    K,
    V,
    BT,
    LENS,
    O,
    scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    stride_ob,
    stride_oh,
    GROUPS: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
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
            m, l_sum, acc = _attend_tile(
                q,
                K,
                V,
                BT,
                start,
                length,
                b,
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
                BLOCK_SIZE,
                KEYS,
                IEEE,
            )
            start += KEYS
    else:  # a range() loop the compiler can software-pipeline
        for start in range(0, length, KEYS):
            m, l_sum, acc = _attend_tile(
                q,
                K,
                V,
                BT,
                start,
                length,
                b,
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
                BLOCK_SIZE,
                KEYS,
                IEEE,
            )
    out = acc / l_sum[:, None]
    tl.store(
        O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty), mask=g_ok[:, None]
    )


# tiles, warps and pipeline depth are tuned once per (group size, head_dim, block size) on the GPU it runs on
_TUNE_CONFIGS = [
    triton.Config({"KEYS": keys}, num_warps=warps, num_stages=stages)
    for keys in (32, 64, 128)
    for warps in (2, 4)
    for stages in (2, 3)
]


def _quick_bench(kernel_call, quantiles):
    """Shorter than Triton's default (25 ms warm-up, 100 ms timing per candidate): twelve candidates in ~1 s."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=5, rep=30, quantiles=quantiles)


_tuned_kernel = triton.autotune(
    configs=_TUNE_CONFIGS, key=["GROUPS_PAD", "HEAD_DIM", "BLOCK_SIZE", "IEEE"], do_bench=_quick_bench
)(_paged_decode_kernel)
_TUNED: dict[tuple, str] = {}  # kernel key -> chosen config, for keys tuned on representative inputs


def _key(heads: int, kv_heads: int, head_dim: int, block_size: int, dtype) -> tuple:
    groups = heads // kv_heads
    return (max(16, triton.next_power_of_2(groups)), head_dim, block_size, dtype == torch.float32)


def _launch(kernel, q, k_pool, v_pool, block_tables, context_lens, out, scale, **extra):
    b, heads, d = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    groups = heads // kv_heads
    kernel[(b, kv_heads)](
        q,
        k_pool,
        v_pool,
        block_tables,
        context_lens,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        k_pool.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUPS=groups,
        GROUPS_PAD=max(16, triton.next_power_of_2(groups)),
        HEAD_DIM=d,
        BLOCK_SIZE=block_size,
        IEEE=q.dtype == torch.float32,
        INTERPRETED=INTERPRETED,
        **extra,
    )


def triton_decode(q, k_pool, v_pool, block_tables, context_lens, scale: float) -> torch.Tensor:
    """Same contract as ``decode.gather_decode``: q [B, H, D] -> [B, H, D]."""
    b, heads, d = q.shape
    _, block_size, kv_heads, d_k = k_pool.shape
    if d != d_k or d & (d - 1) or d < 16:
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16 matching the pool, got {d}")
    q = q.contiguous()
    out = torch.empty_like(q)
    if _key(heads, kv_heads, d, block_size, q.dtype) in _TUNED:
        _launch(_tuned_kernel, q, k_pool, v_pool, block_tables, context_lens, out, scale)
    else:  # untuned: a fixed tile (tuning on whatever inputs came first, e.g. padding rows, would mislead)
        _launch(_paged_decode_kernel, q, k_pool, v_pool, block_tables, context_lens, out, scale, KEYS=KEYS_PER_ITER)
    return out


def tune_triton_decode(
    heads: int, kv_heads: int, head_dim: int, block_size: int, dtype, device, *, batch: int = 128, length: int = 1024
) -> str:
    """Pick the kernel's tile/warps/stages by timing every candidate on ``batch`` sequences of ``length`` keys.

    The keys live in a scratch pool of their own (``batch × length`` tokens, no block read twice), so the
    timing sees HBM, not an engine's small pool sitting in L2; the choice is kept for the process. Run
    before CUDA graphs are captured (autotuning cannot run inside a capture). Returns the chosen
    configuration, or why none was tuned (then the fixed 64-key tile is used).
    """
    device = torch.device(device)
    if INTERPRETED or device.type != "cuda":
        return "not tuned (needs a GPU)"
    key = _key(heads, kv_heads, head_dim, block_size, dtype)
    if key in _TUNED:
        return _TUNED[key]
    per_seq = -(-length // block_size)
    g = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(batch * per_seq, block_size, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn_like(k)
    tables = torch.randperm(batch * per_seq, device=device, generator=g).view(batch, per_seq)
    lens = torch.full((batch,), length, dtype=torch.long, device=device)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype, generator=g)
    try:
        _launch(_tuned_kernel, q, k, v, tables, lens, torch.empty_like(q), head_dim**-0.5)
        torch.cuda.synchronize()
        cfg = _tuned_kernel.best_config
    except Exception as e:  # a tuning failure leaves the fixed tile in place
        return f"not tuned: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    _TUNED[key] = (
        f"KEYS={cfg.kwargs.get('KEYS')}, warps={cfg.num_warps}, stages={cfg.num_stages} "
        f"(tuned at batch {batch} x {length} keys)"
    )
    return _TUNED[key]
