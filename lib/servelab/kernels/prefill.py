"""Prefill attention: each sequence's new tokens attend causally to its cached context and to each other.

- ``prefill_attention``: one sequence, SDPA. Without cached context the new K/V are used directly
  (SDPA picks its fused causal kernel); with context, the sequence's K/V are read back from the pool
  and masked by position (key position <= query position).
- ``varlen_prefill``: every context-free segment of a step in one call of PyTorch's variable-length
  flash attention (``torch.nn.attention.varlen``), where this torch has it (CUDA, 16-bit): one kernel
  per layer instead of one SDPA call per sequence. Its signature changed across torch releases, so
  the call adapts to what it finds; ``varlen_self_check`` compares it with the per-sequence path
  before the engine trusts it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSegment:
    """One sequence's chunk of new tokens in the flat batch."""

    q_start: int  # index of its first token in the flat batch
    q_len: int  # new tokens this step
    context_len: int  # tokens already cached before this chunk
    block_table: torch.Tensor | None  # LongTensor [blocks] on the model's device (needed when context_len > 0)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[heads_kv, L, D] -> [heads_kv * groups, L, D], each KV head repeated for its query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)


def prefill_attention(q, k_new, v_new, seg: PrefillSegment, k_pool, v_pool, scale: float) -> torch.Tensor:
    """Causal attention of one segment: q [n, H, D] over context + new keys; returns [n, H, D]."""
    groups = q.shape[1] // k_new.shape[1]
    if seg.context_len == 0:
        k, v, mask, causal = k_new, v_new, None, True
    else:
        total = seg.context_len + seg.q_len
        k = k_pool[seg.block_table].flatten(0, 1)[:total]  # [total, kv_heads, D]
        v = v_pool[seg.block_table].flatten(0, 1)[:total]
        q_pos = torch.arange(seg.context_len, total, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
        causal = False
    # 4-D inputs [1, H, L, D]: SDPA's fused kernels (flash, cuDNN, efficient) take only 4-D; a 3-D call
    # silently runs the math backend, which materialises the whole L×L score matrix
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        _repeat_kv(k.transpose(0, 1), groups)[None],
        _repeat_kv(v.transpose(0, 1), groups)[None],
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
    )
    return out[0].transpose(0, 1)


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


VARLEN, _VARLEN_PARAMS = _varlen_fn()


def varlen_available(q: torch.Tensor) -> bool:
    return VARLEN is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def varlen_prefill(q, k, v, cu_seqlens: torch.Tensor, max_len: int, scale: float) -> torch.Tensor:
    """Causal attention of several context-free segments packed back to back: q [T, H, D], k/v [T, H_kv, D]."""
    kw = {"scale": scale}
    if "is_causal" in _VARLEN_PARAMS:
        kw["is_causal"] = True
    elif "window_size" in _VARLEN_PARAMS:
        kw["window_size"] = (-1, 0)  # (left, right): causal
    else:
        raise RuntimeError("this torch's varlen_attn has neither is_causal nor window_size")
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        if "enable_gqa" in _VARLEN_PARAMS:
            kw["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if "scale" not in _VARLEN_PARAMS:
        if scale != q.shape[-1] ** -0.5:
            raise RuntimeError("this torch's varlen_attn takes no scale")
        del kw["scale"]
    out = VARLEN(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kw)
    return out[0] if isinstance(out, tuple) else out


def varlen_self_check(device, dtype, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """None if ``varlen_prefill`` agrees with per-sequence SDPA on random data here, else why not."""
    if VARLEN is None:
        return "torch.nn.attention.varlen is not in this torch"
    g = torch.Generator(device=device).manual_seed(0)
    lens = [37, 1, 130]
    total = sum(lens)
    q = torch.randn(total, heads, head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(total, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn(total, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    cu = torch.tensor([0, 37, 38, 168], device=device, dtype=torch.int32)
    scale = head_dim**-0.5
    try:
        got = varlen_prefill(q, k, v, cu, max(lens), scale)
    except Exception as e:  # an unsupported dtype/arch/signature: fall back, say why
        return f"{type(e).__name__}: {e}"
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        ref = prefill_attention(q[sl], k[sl], v[sl], PrefillSegment(start, n, 0, None), None, None, scale)
        err = (got[sl].float() - ref.float()).abs().max().item()
        if not err < 2e-2:
            return f"varlen disagrees with per-sequence SDPA by {err:.3g}"
        start += n
    return None
