"""BlockManager: allocation, appends, exhaustion (state unchanged), freeing, sharing, relocation."""

import pytest

from servelab.kv.block_manager import BlockManager, OutOfBlocks


def snapshot(bm: BlockManager):
    return (
        bm.num_free_blocks,
        {s: (bm.block_table(s), bm.num_tokens(s)) for s in bm.seq_ids},
        [bm.ref_count(b) for b in range(bm.num_blocks)],
    )


def test_allocate_gives_ceil_blocks_lowest_first():
    bm = BlockManager(num_blocks=10, block_size=4)
    assert bm.blocks_needed(0) == 0 and bm.blocks_needed(1) == 1 and bm.blocks_needed(4) == 1
    assert bm.blocks_needed(5) == 2
    assert bm.allocate("a", 9) == [0, 1, 2]
    assert bm.allocate("b", 4) == [3]
    assert bm.num_used_blocks == 4 and bm.num_free_blocks == 6
    assert bm.num_tokens("a") == 9 and bm.ref_count(2) == 1 and bm.ref_count(5) == 0


def test_slot_mapping_follows_block_table():
    bm = BlockManager(8, 4)
    bm.allocate("x", 2)
    bm.allocate("y", 4)  # takes block 1, so x's next block is 2
    slots = bm.append("x", 5)  # positions 2..6 of x
    assert bm.block_table("x") == [0, 2]
    assert slots == [2, 3, 8, 9, 10]
    assert bm.slot_mapping("x", 0, 7) == [0, 1, 2, 3, 8, 9, 10]
    assert bm.slot_mapping("y", 1, 3) == [5, 6]
    with pytest.raises(ValueError):
        bm.slot_mapping("x", 3, 8)  # past the sequence's tokens


def test_append_within_last_block_takes_no_block():
    bm = BlockManager(4, 16)
    bm.allocate(0, 10)
    assert bm.can_append(0, 6)
    assert bm.append(0, 6) == list(range(10, 16))
    assert bm.num_used_blocks == 1
    assert bm.append(0, 1) == [16]
    assert bm.num_used_blocks == 2


def test_exhaustion_raises_and_leaves_state_unchanged():
    bm = BlockManager(4, 4)
    bm.allocate("a", 8)
    bm.allocate("b", 5)
    before = snapshot(bm)
    assert not bm.can_allocate(1)
    with pytest.raises(OutOfBlocks) as e:
        bm.allocate("c", 1)
    assert e.value.needed == 1 and e.value.free == 0 and e.value.seq_id == "c"
    assert "c" not in bm
    assert bm.can_append("b", 3) and not bm.can_append("b", 4)
    with pytest.raises(OutOfBlocks):
        bm.append("b", 4)
    assert snapshot(bm) == before
    bm.append("b", 3)  # what does fit still works after a refusal
    assert bm.num_tokens("b") == 8


def test_free_returns_blocks_and_they_are_reused():
    bm = BlockManager(6, 2)
    bm.allocate("a", 4)  # 0, 1
    bm.allocate("b", 4)  # 2, 3
    bm.free("a")
    assert bm.num_free_blocks == 4 and bm.ref_count(0) == 0
    assert bm.allocate("c", 6) == [0, 1, 4]
    with pytest.raises(KeyError, match="unknown sequence"):
        bm.free("a")
    with pytest.raises(ValueError, match="already"):
        bm.allocate("b", 1)


def test_fork_shares_blocks_with_reference_counts():
    bm = BlockManager(8, 4)
    bm.allocate("p", 8)  # two full blocks
    assert bm.fork("p", "q") == [0, 1]
    assert bm.ref_count(0) == 2 and bm.num_used_blocks == 2
    bm.free("p")
    assert bm.ref_count(0) == 1 and bm.num_free_blocks == 6  # q still holds them
    bm.append("q", 1)  # a full last block: grows into a fresh block, no copy
    assert bm.block_table("q") == [0, 1, 2] and bm.take_copies() == []
    bm.free("q")
    assert bm.num_free_blocks == 8


def test_append_into_shared_partial_block_copies_on_write():
    bm = BlockManager(8, 4)
    bm.allocate("p", 6)  # blocks 0 (full), 1 (2 of 4)
    bm.fork("p", "q")
    bm.allocate("z", 4)  # block 2
    before = snapshot(bm)
    slots = bm.append("q", 1)
    assert bm.block_table("q") == [0, 3]  # private copy of the partial block
    assert bm.block_table("p") == [0, 1]
    assert slots == [3 * 4 + 2]
    assert bm.take_copies() == [(1, 3)] and bm.take_copies() == []
    assert bm.ref_count(1) == 1 and bm.ref_count(0) == 2
    assert before[0] - 1 == bm.num_free_blocks


def test_copy_on_write_counts_in_exhaustion():
    bm = BlockManager(2, 4)
    bm.allocate("p", 2)
    bm.fork("p", "q")
    bm.allocate("z", 1)
    assert not bm.can_append("q", 1)  # needs a private copy, and no block is free
    with pytest.raises(OutOfBlocks):
        bm.append("q", 1)
    assert bm.block_table("q") == [0] and bm.ref_count(0) == 2


def test_relocate_rewrites_tables_and_free_list():
    bm = BlockManager(6, 2)
    bm.allocate("a", 2)  # 0
    bm.allocate("b", 4)  # 1, 2
    bm.allocate("c", 2)  # 3
    bm.fork("c", "d")
    bm.free("b")
    bm.relocate([3], [1])
    assert bm.block_table("c") == [1] and bm.block_table("d") == [1]
    assert bm.ref_count(1) == 2 and bm.ref_count(3) == 0
    assert bm.allocate("e", 4) == [2, 3]
    with pytest.raises(ValueError, match="not free"):
        bm.relocate([0], [1])
    with pytest.raises(ValueError, match="not live"):
        bm.relocate([4], [5])


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        BlockManager(bad, 16)
    with pytest.raises(ValueError):
        BlockManager(16, bad)


def test_bad_token_counts_are_refused():
    bm = BlockManager(4, 4)
    with pytest.raises(ValueError):
        bm.allocate("a", -1)
    bm.allocate("a", 1)
    with pytest.raises(ValueError):
        bm.append("a", 1.5)
    with pytest.raises(KeyError):
        bm.append("nope", 1)


def test_random_workload_keeps_invariants():
    """Random allocate/append/fork/free: ref counts equal table occurrences; free + used = total."""
    import random

    rng = random.Random(0)
    bm = BlockManager(64, 8)
    next_id = 0
    for _ in range(2000):
        op = rng.random()
        seqs = bm.seq_ids
        try:
            if op < 0.35 or not seqs:
                bm.allocate(next_id, rng.randint(1, 60))
                next_id += 1
            elif op < 0.7:
                bm.append(rng.choice(seqs), rng.randint(1, 20))
            elif op < 0.8:
                bm.fork(rng.choice(seqs), next_id)
                next_id += 1
            else:
                bm.free(rng.choice(seqs))
        except OutOfBlocks:
            pass
        bm.take_copies()
        counts = [0] * bm.num_blocks
        for s in bm.seq_ids:
            assert len(bm.block_table(s)) == bm.blocks_needed(bm.num_tokens(s))
            for b in bm.block_table(s):
                counts[b] += 1
        assert counts == [bm.ref_count(b) for b in range(bm.num_blocks)]
        assert bm.num_free_blocks == counts.count(0)
