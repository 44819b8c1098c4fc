"""Split-KV (flash-decoding) decode attention: how many splits, and the merge of their partial outputs.

A decode step reads every sequence's whole context, but one program per (sequence, KV head) puts only
``batch × kv_heads`` programs on the GPU: at batch 1 with two KV heads, 2 of the H200's 132 SMs walk 16K
keys each while the rest idle. Cutting each context into ``splits`` chunks, one program each, fills the
GPU; each program returns its chunk's softmax-normalised output ``o_s`` and log-sum-exp ``lse_s``, and the
exact result is their log-sum-exp merge::

    out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M),    M = max_s lse_s

``decode_splits`` picks ``splits`` so that ``batch × kv_heads × splits`` is about ``WAVES`` times the SM count
while every chunk of the longest context the step can hold keeps at least ``MIN_SPLIT_KEYS`` keys (below
that, the merge and the partials' traffic cost more than the parallelism gains). The kernel then cuts each
sequence's *actual* length into chunks of at least ``MIN_SPLIT_KEYS``, so a short context runs in one split
and the other programs find their range empty.

``split_decode_reference`` is the same arithmetic in PyTorch, for tests.
"""

from __future__ import annotations

import torch

MIN_SPLIT_KEYS = 256  # keys one split walks at least: a few hundred keys amortise its partial write and merge
WAVES = 2  # programs per SM to aim for: one wave in flight while the next loads
MAX_SPLITS = 64  # the merge holds every split's partial in one program's registers
DEFAULT_SMS = 132  # an H200, where the device cannot say (Triton's interpreter on a CPU)


def head_pad(head_dim: int) -> int:
    """The head axis inside a Triton kernel: the next power of two, at least 16 (``tl.arange`` and ``tl.dot``
    need both); lanes past ``head_dim`` are masked."""
    if head_dim < 1:
        raise ValueError(f"head_dim must be positive, got {head_dim}")
    return max(16, 1 << (head_dim - 1).bit_length())


def decode_splits(
    batch: int, kv_heads: int, max_context: int, sms: int | None = None, *, min_keys: int | None = None
) -> int:
    """Programs per (sequence, KV head) for a decode step of ``batch`` sequences whose contexts reach at most
    ``max_context`` keys, on a GPU of ``sms`` SMs (None: ``DEFAULT_SMS``), each split walking at least
    ``min_keys`` keys (None: ``MIN_SPLIT_KEYS``, read at call time so a test may lower it); 1 means no split."""
    if batch < 1 or kv_heads < 1 or max_context < 0:
        raise ValueError(
            f"batch and kv_heads must be positive, max_context >= 0; got {batch}, {kv_heads}, {max_context}"
        )
    target = WAVES * (sms or DEFAULT_SMS)
    to_fill = -(-target // (batch * kv_heads))
    by_length = max(1, max_context // (MIN_SPLIT_KEYS if min_keys is None else min_keys))
    return max(1, min(to_fill, by_length, MAX_SPLITS))


def single_pass_blocks(block_size: int) -> int:
    """The widest block table (in blocks) for which ``decode_splits`` never splits: a decode CUDA graph captured
    at this width runs short contexts in one kernel, with no merge."""
    return max(1, (2 * MIN_SPLIT_KEYS - 1) // block_size)


def split_ranges(length: int, splits: int, keys: int, min_keys: int) -> list[tuple[int, int]]:
    """Each split's keys ``[lo, hi)`` of a context of ``length``, as the kernel computes them: chunks of whole
    ``keys`` tiles, at least ``min_keys`` long; trailing splits may be empty (lo >= hi)."""
    if splits == 1:
        return [(0, length)]
    per_split = -(-length // splits)
    chunk = max(-(-per_split // keys) * keys, min_keys)
    return [(s * chunk, min(s * chunk + chunk, length)) for s in range(splits)]


def merge_partials(part: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """part [..., S, D], lse [..., S] (``-inf`` for an empty split) -> [..., D]."""
    top = lse.max(-1, keepdim=True).values
    w = torch.where(lse > float("-inf"), torch.exp(lse - top), torch.zeros_like(lse))
    return (w[..., None] * part).sum(-2) / w.sum(-1, keepdim=True).clamp_min(1e-30)


def split_decode_reference(
    q, k_pool, v_pool, block_tables, context_lens, scale: float, splits: int, keys: int = 64, min_keys: int = 64
) -> torch.Tensor:
    """Decode attention computed split by split and merged, in float32: q [B, H, D] -> [B, H, D]."""
    b, heads, d = q.shape
    kv_heads = k_pool.shape[2]
    out = torch.empty(b, heads, d, dtype=torch.float32)
    for i, length in enumerate(context_lens.tolist()):
        k = k_pool[block_tables[i]].flatten(0, 1)[:length].float().repeat_interleave(heads // kv_heads, 1)
        v = v_pool[block_tables[i]].flatten(0, 1)[:length].float().repeat_interleave(heads // kv_heads, 1)
        part = torch.zeros(heads, splits, d)
        lse = torch.full((heads, splits), float("-inf"))
        for s, (lo, hi) in enumerate(split_ranges(length, splits, keys, min_keys)):
            if lo >= hi:
                continue
            scores = torch.einsum("hd,lhd->hl", q[i].float(), k[lo:hi]) * scale
            lse[:, s] = torch.logsumexp(scores, -1)
            part[:, s] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[lo:hi])
        out[i] = merge_partials(part, lse)
    return out.to(q.dtype)
