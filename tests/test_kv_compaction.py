"""Compaction: live blocks end up as a prefix and every sequence's K/V is preserved bit for bit."""

import random

import pytest
import torch

from servelab.kv import BlockManager, KVPool, compact, plan_compaction
from servelab.kv.compaction import move_blocks


def fragmented(num_blocks=64, block_size=4, seed=0):
    """A pool after random arrivals and departures, every live token holding random K/V."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    bm = BlockManager(num_blocks, block_size)
    pool = KVPool(
        layers=3, num_blocks=num_blocks, block_size=block_size, kv_heads=2, head_dim=4, dtype=torch.bfloat16
    ).fill_random(g)
    for i in range(40):  # churn, then departures that leave holes nothing refills
        if bm.can_allocate(12):
            bm.allocate(i, rng.randint(1, 12))
        if i % 3 == 2:
            bm.free(rng.choice(bm.seq_ids))
    for s in rng.sample(bm.seq_ids, len(bm.seq_ids) // 2):
        bm.free(s)
    bm.fork(bm.seq_ids[0], "fork")  # shared blocks must move once and stay shared
    for s in bm.seq_ids:
        n = bm.num_tokens(s)
        for layer in range(3):
            pool.write(
                layer,
                torch.tensor(bm.slot_mapping(s, 0, n)),
                torch.randn(n, 2, 4, generator=g),
                torch.randn(n, 2, 4, generator=g),
            )
    return bm, pool


def contents(bm, pool):
    return {
        s: [pool.gather(layer, torch.tensor(bm.block_table(s)), bm.num_tokens(s)) for layer in range(3)]
        for s in bm.seq_ids
    }


def test_plan_moves_only_blocks_beyond_the_prefix():
    bm, _ = fragmented()
    plan = plan_compaction(bm)
    assert plan.live == len(bm.live_blocks())
    assert all(s >= plan.live for s in plan.src) and all(d < plan.live for d in plan.dst)
    assert plan.moved > 0 and 0 < plan.fraction_moved <= 1


@pytest.mark.parametrize("method", ["gather_scatter", "gather_scatter_wide", "block_loop"])
def test_compaction_preserves_kv_bit_for_bit(method):
    bm, pool = fragmented()
    before = contents(bm, pool)
    plan = compact(pool, bm, method=method)
    assert plan.moved > 0
    assert bm.live_blocks() == list(range(plan.live))  # a contiguous prefix
    after = contents(bm, pool)
    assert before.keys() == after.keys()
    for s in before:
        for (k0, v0), (k1, v1) in zip(before[s], after[s], strict=True):
            assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert bm.block_table("fork") == bm.block_table(bm.seq_ids[0])
    assert compact(pool, bm, method=method).moved == 0  # already compact: nothing to do


def test_compacted_manager_keeps_allocating_after_the_prefix():
    bm, pool = fragmented()
    plan = compact(pool, bm)
    assert bm.allocate("new", 1) == [plan.live]


def test_wide_view_reinterprets_bytes_only_when_they_fit():
    from servelab.kv.compaction import wide_view

    bf16 = torch.zeros(2, 3, 8, dtype=torch.bfloat16)
    assert wide_view(bf16).dtype == torch.int64 and wide_view(bf16).shape == (2, 3, 2)
    odd = torch.zeros(2, 3, 6, dtype=torch.bfloat16)  # 12 bytes per row: not whole 64-bit words
    assert wide_view(odd) is odd
    assert wide_view(torch.zeros(4, dtype=torch.float64)).dtype == torch.float64


def test_bad_arguments():
    bm, pool = fragmented()
    with pytest.raises(ValueError, match="method"):
        compact(pool, bm, method="memcpy")
    with pytest.raises(ValueError, match="different pools"):
        compact(KVPool(1, 8, 4, 1, 4, dtype=torch.float32), bm)
    with pytest.raises(ValueError, match="equal length"):
        move_blocks(pool, [1, 2], [3])
    with pytest.raises(ValueError, match="stream"):
        compact(pool, bm, stream=object())


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["gather_scatter", "gather_scatter_wide", "block_loop"])
def test_compaction_on_a_side_stream_preserves_kv_on_cuda(method):
    bm, cpu_pool = fragmented()
    pool = KVPool(3, cpu_pool.num_blocks, cpu_pool.block_size, 2, 4, dtype=torch.bfloat16, device="cuda")
    pool.kv.copy_(cpu_pool.kv)
    before = contents(bm, cpu_pool)
    side = torch.cuda.Stream()
    plan = compact(pool, bm, method=method, stream=side)
    torch.cuda.current_stream().wait_stream(side)
    assert plan.moved > 0
    for s, layers in before.items():
        for layer, (k0, v0) in enumerate(layers):
            k1, v1 = pool.gather(layer, bm.block_table(s), bm.num_tokens(s))
            assert torch.equal(k0, k1.cpu()) and torch.equal(v0, v1.cpu())
