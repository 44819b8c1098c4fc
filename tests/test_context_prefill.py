"""Batched prefill attention over cached context equals the per-segment path, padding and GQA included."""

import pytest
import torch

from servelab.kernels.context_prefill import build_context_batch, context_prefill
from servelab.kernels.prefill import PrefillSegment, prefill_attention


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_batched_equals_one_segment_at_a_time(heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    block_size, blocks, d = 4, 32, 8
    k_pool = torch.randn(blocks, block_size, kv_heads, d, generator=g)
    v_pool = torch.randn(blocks, block_size, kv_heads, d, generator=g)
    # (new tokens, cached tokens, block table): different lengths, a one-token chunk, a table out of order
    specs = [(5, 7, [3, 9, 4]), (1, 30, [10, 11, 12, 13, 14, 15, 16, 17]), (3, 2, [20, 2])]
    fresh = 4  # a context-free segment first in the flat batch: its rows must stay untouched
    total = fresh + sum(n for n, _, _ in specs)
    q = torch.randn(total, heads, d, generator=g)
    segments, ref, start = [], [], fresh
    for n, c, table in specs:
        slots = (torch.tensor(table)[:, None] * block_size + torch.arange(block_size)).flatten()[: c + n]
        segments.append((start, n, c, slots))
        seg = PrefillSegment(start, n, c, torch.tensor(table))
        k_new, v_new = k_pool.flatten(0, 1)[slots[c:]], v_pool.flatten(0, 1)[slots[c:]]  # written before attention
        ref.append(prefill_attention(q[start : start + n], k_new, v_new, seg, k_pool, v_pool, d**-0.5))
        start += n
    cb = build_context_batch(segments, "cpu")
    got = context_prefill(q, k_pool, v_pool, cb, d**-0.5)
    assert cb.out_index.tolist() == list(range(fresh, total))
    assert cb.kv_slots.shape[1] % 16 == 0 and not torch.isnan(got).any()
    torch.testing.assert_close(got, torch.cat(ref), rtol=1e-5, atol=1e-5)
