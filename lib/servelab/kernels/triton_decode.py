"""A paged decode-attention kernel in Triton: reads each sequence's K/V in place through its block table.

One program per (sequence, KV head) computes all query heads of that KV head (grouped-query
attention loads each K/V tile once for the whole group), walking the sequence's keys
``KEYS_PER_ITER`` at a time with an online softmax (running max and sum), so K and V are read from
HBM exactly once and nothing is materialised. Key ``p`` of a sequence sits in pool block
``block_table[p // block_size]`` at offset ``p % block_size``.

Any head size: ``tl.arange`` needs a power of two, so the head axis is padded to the next one (at least 16,
for the matrix units) and masked; padded lanes load as 0 and add nothing to a dot product or an output.

Long contexts (split-KV, flash-decoding): with few sequences, one program per (sequence, KV head) leaves
most SMs idle while each walks thousands of keys. Then the launch grid gets a third axis of ``splits``
programs per (sequence, KV head); program ``s`` walks its own chunk of the keys and writes a partial output
with its log-sum-exp, and a second kernel merges the partials (``split_kv.py`` chooses ``splits`` and holds
the same merge in PyTorch). The chunk is computed in the kernel from the sequence's length, so the grid
depends only on the batch and the block-table width, and a CUDA graph captured once serves every context.

Tests run it on the CPU under ``TRITON_INTERPRET=1`` against the gather backend.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from servelab.kernels import pdl as pdl_launch
from servelab.kernels.split_kv import MIN_SPLIT_KEYS, decode_splits, head_pad
from servelab.kernels.triton_fold import fold_keys

KEYS_PER_ITER = 64
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _key_range(length, split, SPLITS: tl.constexpr, KEYS: tl.constexpr, MIN_KEYS: tl.constexpr):
    """Keys [lo, hi) of split ``split``: the context cut into SPLITS chunks of whole key tiles, each at least
    MIN_KEYS long, so a short context uses few splits and the rest find their range empty."""
    if SPLITS == 1:
        lo = 0
        hi = length
    else:
        chunk = tl.cdiv(tl.cdiv(length, SPLITS), KEYS) * KEYS
        chunk = tl.maximum(chunk, MIN_KEYS)
        lo = split * chunk
        hi = tl.minimum(lo + chunk, length)
    return lo, hi


# the block-table stride is the step's table width, which varies from eager step to eager step: without
# this, Triton would compile a new variant (divisible by 16 or not, equal to 1) in the middle of a run
@triton.jit(do_not_specialize=["stride_btb"])
def _paged_decode_kernel(
    Q,
    K,
    V,
    BT,
    LENS,
    Out,
    LSE,
    scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    GROUPS: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
    INTERPRETED: tl.constexpr,
    SPLITS: tl.constexpr,
    MIN_KEYS: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # everything this kernel reads (q, the new token's K/V, the lengths) the launch before may have written
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()  # the next (o_proj) may start reading its weights
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(LENS + b)
    lo, hi = _key_range(length, split, SPLITS, KEYS, MIN_KEYS)
    offs_g = tl.arange(0, GROUPS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    g_ok = offs_g < GROUPS
    row_mask = g_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    heads = kvh * GROUPS + offs_g
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_mask, other=0.0)
    m = tl.full([GROUPS_PAD], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([GROUPS_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUPS_PAD, HEAD_PAD], dtype=tl.float32)
    if INTERPRETED:  # the interpreter cannot range() over a loaded value; a while loop is the same walk
        start = lo
        while start < hi:
            m, l_sum, acc = fold_keys(
                q, K, V, BT, start, hi, 0, b, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh, stride_btb,
                HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, False,
            )  # fmt: skip
            start += KEYS
    else:  # a range() loop the compiler can software-pipeline
        for start in range(lo, hi, KEYS):
            m, l_sum, acc = fold_keys(
                q, K, V, BT, start, hi, 0, b, kvh, m, l_sum, acc, scale, stride_kb, stride_ks, stride_kh, stride_btb,
                HEAD_DIM, HEAD_PAD, BLOCK_SIZE, KEYS, IEEE, False,
            )  # fmt: skip
    # a split past the end of a short context saw no key: output 0 with log-sum-exp -inf, weight 0 in the merge
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    dst = Out + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(dst, out.to(Out.dtype.element_ty), mask=row_mask)
    if SPLITS > 1:
        lse = tl.where(l_sum > 0, m + tl.log(tl.where(l_sum > 0, l_sum, 1.0)), float("-inf"))
        tl.store(LSE + b * stride_lb + heads * stride_lh + split, lse, mask=g_ok)


@triton.jit
def _merge_splits_kernel(
    Part,
    LSE,
    Out,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """One program per (sequence, query head): out = sum_s exp(lse_s - M) part_s / sum_s exp(lse_s - M)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    s_ok = offs_s < SPLITS
    d_ok = offs_d < HEAD_DIM
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp(lse - top), 0.0)
    part = tl.load(
        Part + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    out = tl.sum(w[:, None] * part, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)


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
_PINNED: dict[tuple, dict] = {}  # kernel key -> the launch measured for this device (kernels/decode_launch.py)


def _groups_pad(groups: int) -> int:
    return max(16, triton.next_power_of_2(groups))


def _key(heads: int, kv_heads: int, head_dim: int, block_size: int, dtype) -> tuple:
    return (_groups_pad(heads // kv_heads), head_dim, block_size, dtype == torch.float32)


def _launch(
    kernel, q, k_pool, v_pool, block_tables, context_lens, out, lse, scale, splits: int, pdl: bool = False, **extra
):  # fmt: skip
    """``out`` is [B, H, D] (one split) or the partials [B, H, splits, D] with ``lse`` [B, H, splits]; ``pdl``:
    programmatic dependent launch (``kernels.pdl``)."""
    b, heads, d = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    split_stride = out.stride(2) if splits > 1 else 0
    kernel[(b, kv_heads, splits)](
        q,
        k_pool,
        v_pool,
        block_tables,
        context_lens,
        out,
        lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        k_pool.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        split_stride,
        lse.stride(0),
        lse.stride(1),
        GROUPS=heads // kv_heads,
        GROUPS_PAD=_groups_pad(heads // kv_heads),
        HEAD_DIM=d,
        HEAD_PAD=head_pad(d),
        BLOCK_SIZE=block_size,
        IEEE=q.dtype == torch.float32,
        INTERPRETED=INTERPRETED,
        SPLITS=splits,
        PDL=pdl,
        **pdl_launch.launch_kw(pdl),
        **extra,
    )


def _merge(part, lse, out) -> None:
    b, heads, splits, d = part.shape
    _merge_splits_kernel[(b, heads)](
        part,
        lse,
        out,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        SPLITS=splits,
        SPLITS_PAD=triton.next_power_of_2(splits),
        HEAD_DIM=d,
        HEAD_PAD=head_pad(d),
    )


_SM_COUNT: dict[int, int] = {}


def sm_count(device) -> int | None:
    """Streaming multiprocessors of a CUDA ``device`` (None elsewhere), asked once per device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def triton_decode(
    q,
    k_pool,
    v_pool,
    block_tables,
    context_lens,
    scale: float,
    *,
    splits: int | None = None,
    min_split_keys=None,
    split_launch_kw: dict | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Same contract as ``decode.gather_decode``: q [B, H, D] -> [B, H, D].

    ``splits``: programs per (sequence, KV head); None chooses from the batch, the KV heads, the block-table
    width (the longest context the step can hold) and the GPU's SM count (``split_kv.decode_splits``).
    ``min_split_keys``: the shortest chunk one split walks (tests set it small to split short contexts).
    ``split_launch_kw``: the split programs' launch (KEYS and Triton's num_warps / num_stages) instead of
    ``split_launch``'s, for a bench that times two launches in one process.
    ``pdl``: the attention launch takes programmatic dependent launch (``kernels.pdl``; the calling context's
    choice when None)."""
    b, heads, d = q.shape
    _, block_size, kv_heads, d_k = k_pool.shape
    if d != d_k:
        raise ValueError(f"query head_dim {d} does not match the KV pool's {d_k}")
    if splits is None:
        splits = decode_splits(b, kv_heads, block_tables.shape[1] * block_size, sm_count(q.device))
    min_keys = MIN_SPLIT_KEYS if min_split_keys is None else min_split_keys
    pdl = pdl_launch.wanted(q.device, pdl)
    q = q.contiguous()
    out = torch.empty_like(q)
    if splits == 1:
        lse = out  # not read when there is one split
        key = _key(heads, kv_heads, d, block_size, q.dtype)
        if key in _PINNED:
            _launch(
                _paged_decode_kernel, q, k_pool, v_pool, block_tables, context_lens, out, lse, scale, 1, pdl,
                MIN_KEYS=1, **_PINNED[key],
            )  # fmt: skip
        elif key in _TUNED:
            _launch(_tuned_kernel, q, k_pool, v_pool, block_tables, context_lens, out, lse, scale, 1, pdl, MIN_KEYS=1)
        else:  # untuned: a fixed tile (tuning on whatever inputs came first, e.g. padding rows, would mislead)
            _launch(
                _paged_decode_kernel, q, k_pool, v_pool, block_tables, context_lens, out, lse, scale, 1, pdl,
                KEYS=KEYS_PER_ITER, MIN_KEYS=1,
            )  # fmt: skip
        return out
    part = torch.empty(b, heads, splits, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, heads, splits, dtype=torch.float32, device=q.device)
    _launch(
        _paged_decode_kernel, q, k_pool, v_pool, block_tables, context_lens, part, lse, scale, splits, pdl,
        MIN_KEYS=min_keys, **(split_launch_kw or split_launch(_key(heads, kv_heads, d, block_size, q.dtype), min_keys)),
    )  # fmt: skip
    _merge(part, lse, out)
    return out


def split_launch(key: tuple, min_keys: int) -> dict:
    """The split program's launch: the one measured for this device and kernel key where one is pinned, its tile cut
    to the shortest chunk (a chunk is a whole number of tiles, at least ``min_keys`` long); else the fixed 64-key
    tile at Triton's default warps and stages.

    Why the pinned launch: a split program runs the one-pass kernel over its chunk, and on the H100 and the H200
    alike (data/tuning/decode_launch/, 3 processes each) the fixed tile at the default warps and stages took
    1.2-1.6x the measured launch's time over the same keys in one pass. The split path kept that tile until
    2026-12-07, when an H100's forced-splits sweep timed a 256-key split program at about 1.6x the one-pass
    kernel's time per key (data/dev/nvidia-h100/2026-12-07/decode_splits_9d76b56.csv)."""
    cap = max(16, triton.next_power_of_2(min_keys))  # tl.dot needs 16 rows
    pin = _PINNED.get(key)
    if pin is None:
        return {"KEYS": min(KEYS_PER_ITER, cap)}
    return {**pin, "KEYS": min(pin["KEYS"], cap)}


def pin_measured_launch(slug: str, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype) -> str | None:
    """Pin the launch measured for device ``slug`` at this kernel key, for the process; what was pinned, or None
    where the device or the key has no measurements."""
    from servelab.kernels.decode_launch import measured_launch

    pin = measured_launch(slug, heads, kv_heads, head_dim, block_size)
    if pin is None:
        return None
    key = _key(heads, kv_heads, head_dim, block_size, dtype)
    _PINNED[key] = {"KEYS": pin.keys, "num_warps": pin.warps, "num_stages": pin.stages}
    _TUNED[key] = (
        f"KEYS={pin.keys}, warps={pin.warps}, stages={pin.stages} (measured: data/tuning/decode_launch/{slug}.csv)"
    )
    return _TUNED[key]


def tune_triton_decode(
    heads: int, kv_heads: int, head_dim: int, block_size: int, dtype, device, *, batch: int = 128, length: int = 1024
) -> str:
    """Pick the kernel's tile/warps/stages: the launch measured for this device and shape where there is one
    (``kernels.decode_launch``, from ``data/tuning/decode_launch/``: the same in every process, and chosen over the
    decode points the engine runs), else by timing every candidate on ``batch`` sequences of ``length`` keys.

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
    if dtype != torch.float32:  # the measurements are of 16-bit pools; float32 runs another kernel (IEEE dots)
        from servelab.kernels.decode_launch import device_slug

        pinned = pin_measured_launch(device_slug(device), heads, kv_heads, head_dim, block_size, dtype)
        if pinned is not None:
            return pinned
    per_seq = -(-length // block_size)
    g = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(batch * per_seq, block_size, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn_like(k)
    tables = torch.randperm(batch * per_seq, device=device, generator=g).view(batch, per_seq)
    lens = torch.full((batch,), length, dtype=torch.long, device=device)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype, generator=g)
    try:
        out = torch.empty_like(q)
        _launch(_tuned_kernel, q, k, v, tables, lens, out, out, head_dim**-0.5, 1, MIN_KEYS=1)
        torch.cuda.synchronize()
        cfg = _tuned_kernel.best_config
    except Exception as e:  # a tuning failure leaves the fixed tile in place
        return f"not tuned: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    _TUNED[key] = (
        f"KEYS={cfg.kwargs.get('KEYS')}, warps={cfg.num_warps}, stages={cfg.num_stages} "
        f"(tuned at batch {batch} x {length} keys)"
    )
    return _TUNED[key]
