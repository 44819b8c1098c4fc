"""Automatic prefix caching, without a model: the block index, the evictable set (LRU, LFU), the block
manager's sharing and eviction, and the scheduler driven over random loads with a shadow KV pool that
records which tokens each slot's K/V were computed from, so that any stale or foreign block is caught."""

import random

import pytest

from servelab.engine import EngineConfig, SamplingParams, Sequence
from servelab.engine.policies import make_scheduler
from servelab.errors import ParameterError
from servelab.kv import BlockManager
from servelab.kv.block_manager import OutOfBlocks
from servelab.kv.prefix_cache import PrefixCache

BS = 4


def cached_bm(num_blocks=8, eviction="lru"):
    return BlockManager(num_blocks, BS, PrefixCache(BS, eviction))


def put(bm, seq_id, tokens, cached=()):
    """Allocate ``tokens`` for ``seq_id`` sharing ``cached`` blocks, and index its full blocks."""
    table = bm.allocate(seq_id, len(tokens), cached)
    bm.cache_blocks(seq_id, len(tokens), lambda a, b: tokens[a:b])
    return table


# ---- the index ---------------------------------------------------------------------------------------


def test_a_block_matches_only_under_the_same_whole_prefix():
    bm = cached_bm()
    a = list(range(12))
    table = put(bm, "a", a)
    assert bm.match_prefix(a) == table
    assert bm.match_prefix(a + [99, 98]) == table  # a trailing partial block is never matched
    assert bm.match_prefix(a[:7]) == table[:1]  # full blocks only
    assert bm.match_prefix(a[4:]) == []  # same tokens at another position: a foreign block
    assert bm.match_prefix([0, 1, 2, 3, 9, 9, 9, 9]) == table[:1]  # diverges in the second block
    assert bm.match_prefix([]) == []


def test_without_a_cache_nothing_matches_and_freeing_returns_blocks():
    bm = BlockManager(4, BS)
    bm.allocate("a", 8)
    bm.cache_blocks("a", 8, lambda a, b: list(range(a, b)))  # a no-op
    assert bm.match_prefix(list(range(8))) == [] and bm.num_cached_blocks == 0
    bm.free("a")
    assert bm.num_free_blocks == 4


def test_shared_blocks_are_referenced_once_per_sequence_and_cached_when_released():
    bm = cached_bm(num_blocks=6)
    a = list(range(10))  # 2 full blocks + a partial one
    ta = put(bm, "a", a)
    hit = bm.match_prefix(a[:9])
    assert hit == ta[:2]
    tb = put(bm, "b", a[:8] + [50, 51, 52], hit)
    assert tb[:2] == ta[:2] and tb[2] != ta[2]
    assert [bm.ref_count(b) for b in ta[:2]] == [2, 2]
    assert bm.num_used_blocks == 4 and bm.num_cached_blocks == 2
    bm.free("a")
    bm.free("b")
    # the partial blocks are free again; the two full ones stay cached, evictable, and count as free capacity
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 6 and bm.num_cached_blocks == 2
    assert bm.match_prefix(a) == ta[:2]


def test_allocation_evicts_only_when_the_free_list_is_empty_and_never_a_referenced_block():
    bm = cached_bm(num_blocks=4)
    a, b = list(range(8)), list(range(100, 108))
    ta = put(bm, "a", a)
    tb = put(bm, "b", b)
    bm.free("a")  # a's blocks evictable; b's still referenced
    c = put(bm, "c", list(range(200, 204)))  # no free block left: evicts from a's prefix, never b's
    assert c == [ta[1]] and bm.prefix_cache.evictions == 1  # a's tail went first
    assert bm.match_prefix(b) == tb  # b's blocks untouched
    assert bm.match_prefix(a) == ta[:1]  # a's first block is still cached
    with pytest.raises(OutOfBlocks):
        bm.allocate("d", 3 * BS)  # only what is free or evictable can be taken; state unchanged
    assert bm.match_prefix(b) == tb and bm.ref_count(tb[0]) == 1


def test_evicting_a_block_drops_its_cached_descendants_too():
    bm = cached_bm(num_blocks=3, eviction="lru")
    a = list(range(12))
    ta = put(bm, "a", a)
    bm.free("a")
    # the tail was released first, so at equal recency it is the first victim; take all three blocks
    put(bm, "x", list(range(50, 54)))
    assert bm.match_prefix(a) == ta[:2]
    bm.free("x")
    bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 3
    ta = put(bm, "a", a)
    bm.free("a")
    cache = bm.prefix_cache
    root = ta[0]
    # evict the root by hand: its two descendants are unreachable, so they leave the cache and become free
    cache._evictable.remove(root)
    cache._evictable._order[root] = None
    cache._evictable._order.move_to_end(root, last=False)
    freed = cache.evict()
    assert freed[0] == root and set(freed) == set(ta) and len(cache) == 0


def test_lru_recycles_the_least_recently_released_prefix_and_lfu_the_least_hit():
    for eviction, survivor in (("lru", "b"), ("lfu", "a")):
        bm = cached_bm(num_blocks=2, eviction=eviction)
        a, b = list(range(4)), list(range(10, 14))
        put(bm, "a", a)
        bm.free("a")
        for i in range(3):  # a is reused three times: popular
            put(bm, f"a{i}", a, bm.match_prefix(a))
            bm.free(f"a{i}")
        put(bm, "b", b)
        bm.free("b")  # b released after a: the most recent
        put(bm, "c", list(range(20, 24)))  # one block must go
        kept = {"a": bm.match_prefix(a) != [], "b": bm.match_prefix(b) != []}
        assert kept == {"a": survivor == "a", "b": survivor == "b"}, eviction


def test_can_allocate_counts_the_evictable_blocks_a_hit_would_pin():
    bm = cached_bm(num_blocks=3)
    a = list(range(8))
    put(bm, "a", a)
    bm.free("a")  # 2 evictable + 1 free = 3 free
    hit = bm.match_prefix(a)
    assert bm.can_allocate(12, hit)  # 2 shared + 1 new
    assert not bm.can_allocate(16, hit)  # 2 shared + 2 new: pinning the hit leaves only 1
    assert not bm.can_allocate(16)  # without the hit: 4 new
    with pytest.raises(ValueError, match="more than"):
        bm.can_allocate(4, hit)


def test_allocating_blocks_that_are_not_cached_is_an_error():
    bm = cached_bm()
    bm.allocate("a", 4)
    with pytest.raises(ValueError, match="not all in the prefix cache"):
        bm.allocate("b", 8, [bm.block_table("a")[0]])
    with pytest.raises(ValueError, match="not all in the prefix cache"):
        BlockManager(4, BS).allocate("c", 4, [0])


def test_compaction_refuses_a_pool_with_cached_prefixes():
    bm = cached_bm()
    put(bm, "a", list(range(4)))
    with pytest.raises(ValueError, match="prefix"):
        bm.relocate([0], [5])


def test_truncating_into_a_cached_block_uncaches_it():
    bm = cached_bm()
    a = list(range(8))
    ta = put(bm, "a", a)
    bm.truncate("a", 6)  # the second block will be overwritten from position 6
    assert bm.match_prefix(a) == ta[:1]


def test_hit_rate_counts_tokens_and_blocks():
    cache = PrefixCache(BS)
    cache.record_lookup(10, 0)
    cache.record_lookup(10, 8)
    assert cache.hit_rate == pytest.approx(8 / 20)
    assert cache.block_hit_rate == pytest.approx(2 / 4)
    assert cache.stats()["prefix_hit_tokens"] == 8


@pytest.mark.parametrize(
    "kw, match", [({"prefix_eviction": "fifo"}, "prefix_eviction"), ({"prefix_caching": "yes"}, "prefix_caching")]
)
def test_bad_engine_config_is_a_clear_error(kw, match):
    with pytest.raises(ParameterError, match=match):
        EngineConfig(**kw)


def test_bad_cache_parameters_are_clear_errors():
    with pytest.raises(ParameterError, match="eviction"):
        PrefixCache(4, "mru")
    with pytest.raises(ParameterError, match="block_size"):
        PrefixCache(0)
    with pytest.raises(ValueError, match="block size"):
        BlockManager(8, 4, PrefixCache(8))


# ---- the scheduler over random loads, with a shadow pool ---------------------------------------------

VOCAB = 50


def next_token(tokens) -> int:
    """The 'model': a deterministic function of the whole sequence, so a wrong context changes outputs."""
    return hash(tuple(tokens)) % VOCAB


def expected_output(prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(next_token(toks))
    return toks[len(prompt) :]


def check_invariants(bm):
    cache = bm.prefix_cache
    refs = {}
    for table in bm._tables.values():
        for b in table:
            refs[b] = refs.get(b, 0) + 1
    assert all(bm.ref_count(b) == refs.get(b, 0) for b in range(bm.num_blocks))
    free = set(bm._free)
    assert len(free) == len(bm._free)
    assert not free & set(cache._by_block)  # a free block is never indexed
    assert not free & set(refs)  # nor referenced
    for b in range(bm.num_blocks):
        if b in cache._evictable:
            assert b in cache._by_block and refs.get(b, 0) == 0
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    assert len(free) + cache.num_evictable + len(refs) == bm.num_blocks  # every block is in exactly one state


def check_step_reads_own_kv(items, bm, pool):
    """Every layer writes the whole step's K/V first, then attends over the context: each slot a sequence reads must
    hold that sequence's own tokens (``pool``: slot -> the tokens, position 0 … p, whose K/V the slot holds)."""
    for it in items:
        seq = it.seq
        assert seq.kv_slots[: it.start + it.num_tokens] == bm.slot_mapping(seq.seq_id, 0, it.start + it.num_tokens)
        for j, slot in enumerate(it.slots):
            pool[slot] = tuple(seq.token_ids(0, it.start + j + 1))
    for it in items:
        seq = it.seq
        for p in range(it.start + it.num_tokens):
            assert pool.get(seq.kv_slots[p]) == tuple(seq.token_ids(0, p + 1)), (
                f"stale or foreign K/V at position {p} of {seq}"
            )


def shadow_run(policy, seed, eviction, num_blocks=14):
    rng = random.Random(seed)
    budget = 24
    bm = cached_bm(num_blocks, eviction)
    s = make_scheduler(policy, block_manager=bm, max_num_seqs=3, max_num_batched_tokens=budget)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 13))] for _ in range(4)]
    pool = {}  # slot -> the tokens (position 0 … p) whose K/V the slot holds
    seqs, arrivals = [], {}

    def request(prompt, at):
        q = Sequence(prompt, SamplingParams(max_tokens=rng.randint(1, min(6, budget - len(prompt))), ignore_eos=True))
        seqs.append(q)
        arrivals.setdefault(at, []).append(q)

    for _ in range(14):
        request(rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))], rng.randint(0, 30))
    for k in range(3000):
        for q in arrivals.pop(k, []):
            s.add(q)
        if not s.has_unfinished() and not arrivals:
            break
        batch = s.schedule()
        items = batch.items
        check_step_reads_own_kv(items, bm, pool)
        sampled = [next_token(it.seq.token_ids(0, it.seq.num_tokens)) if it.samples else None for it in items]
        for ev in s.postprocess(batch, sampled):
            q = next(q for q in seqs if q.seq_id == ev.seq_id)
            if ev.finished and len(q.prompt_token_ids) + len(q.output_token_ids) < budget - 2 and rng.random() < 0.5:
                # a follow-up turn: the whole conversation so far, then a new message
                history = q.prompt_token_ids + q.output_token_ids
                request(
                    history + [rng.randrange(VOCAB) for _ in range(rng.randint(1, budget - 1 - len(history)))],
                    k + rng.randint(1, 4),
                )
        check_invariants(bm)
    else:
        raise AssertionError("did not finish")
    for q in seqs:
        assert q.output_token_ids == expected_output(q.prompt_token_ids, q.params.max_tokens)
    assert bm.num_used_blocks == 0
    return s, bm


@pytest.mark.parametrize("policy", ["fcfs", "eager_cont_batch", "chunked_prefill"])
@pytest.mark.parametrize("seed", range(5))
def test_random_loads_with_sharing_eviction_and_preemption_never_read_a_stale_block(policy, seed):
    s, bm = shadow_run(policy, seed, "lru" if seed % 2 else "lfu", num_blocks=8 if seed < 3 else 14)
    assert bm.prefix_cache.hit_tokens > 0  # prefixes really were shared


def test_the_random_loads_exercise_eviction_and_preemption():
    runs = [shadow_run(p, seed, "lru", num_blocks=8) for p in ("fcfs", "chunked_prefill") for seed in range(5)]
    assert sum(bm.prefix_cache.evictions for _, bm in runs) > 0
    assert sum(s.num_preemptions for s, _ in runs) > 0
