"""The block manager: which fixed-size KV blocks each sequence owns, and nothing else.

Pure Python (no torch), so the scheduler and the simulator can use it without a GPU.

A sequence's tokens live in blocks of ``block_size`` token slots. Token position ``p`` of a sequence sits
in block ``table[p // block_size]`` at offset ``p % block_size``; its *slot* in the flattened pool is
``block_id * block_size + offset``. The engine writes K/V through slots (``slot_mapping``) and reads
through block tables (``block_table``).

Blocks carry reference counts so that several sequences can share a prefix (``fork``). A sequence that
appends into a shared, partially filled last block gets a private copy of it (copy-on-write): the manager
allocates the new block and queues the (source, destination) block pair; whoever owns the K/V pool must
copy those blocks (``take_copies``) before writing the new tokens.

Free blocks are handed out lowest id first, so a pool that only grows stays a contiguous prefix; frees
in the middle leave holes, which compaction (``servelab.kv.compaction``) closes with ``relocate``.

With a prefix cache (``servelab.kv.prefix_cache.PrefixCache``), full blocks are also indexed by the tokens
they hold: ``match_prefix`` finds the blocks of a request's longest cached prefix, ``allocate(...,
cached_blocks=...)`` shares them, ``cache_blocks`` indexes a sequence's newly computed full blocks. A cached
block whose last reference goes away keeps its K/V and becomes *evictable* instead of free; it counts as free
capacity, and ``_take`` recycles one (evicting it from the cache) only when the free list is empty.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence


class OutOfBlocks(RuntimeError):
    """Not enough free blocks. The manager's state is unchanged; the scheduler should queue or preempt."""

    def __init__(self, needed: int, free: int, seq_id=None):
        self.needed = needed
        self.free = free
        self.seq_id = seq_id
        who = f" for sequence {seq_id!r}" if seq_id is not None else ""
        super().__init__(f"need {needed} KV blocks{who}, only {free} free")


class BlockManager:
    """Allocates blocks of ``block_size`` token slots out of ``num_blocks`` and keeps per-sequence block tables."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache=None):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))  # a heap: lowest id first keeps the pool compact
        self._ref = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._copies: list[tuple[int, int]] = []
        if prefix_cache is not None and prefix_cache.block_size != block_size:
            raise ValueError(f"prefix cache block size {prefix_cache.block_size} != block_size {block_size}")
        self.prefix_cache = prefix_cache  # None: no prefix caching

    # ---- capacity ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free ones, and cached ones no sequence references (evictable)."""
        return len(self._free) + (self.prefix_cache.num_evictable if self.prefix_cache is not None else 0)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache, referenced or evictable (0 without a cache)."""
        return len(self.prefix_cache) if self.prefix_cache is not None else 0

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        _check_count("num_tokens", num_tokens)
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Whether ``allocate(seq, num_tokens, cached_blocks)`` would succeed now."""
        return self._allocate_cost(num_tokens, cached_blocks) <= self.num_free_blocks

    def _allocate_cost(self, num_tokens: int, cached_blocks: Sequence[int]) -> int:
        """Free or evictable blocks an allocation uses up: its new blocks, and the evictable cached ones it reuses."""
        if len(cached_blocks) * self.block_size > num_tokens:
            raise ValueError(f"{len(cached_blocks)} cached blocks hold more than the {num_tokens} tokens allocated")
        return self.blocks_needed(num_tokens) - len(cached_blocks) + sum(self._ref[b] == 0 for b in cached_blocks)

    def _append_cost(self, seq_id, num_new_tokens: int) -> tuple[int, bool]:
        """New blocks an append needs, and whether the last block must be copied first (it is shared)."""
        _check_count("num_new_tokens", num_new_tokens)
        table, n = self._table(seq_id), self._tokens[seq_id]
        grow = self.blocks_needed(n + num_new_tokens) - len(table)
        cow = num_new_tokens > 0 and n % self.block_size != 0 and self._ref[table[-1]] > 1
        return grow + int(cow), cow

    def can_append(self, seq_id, num_new_tokens: int) -> bool:
        return self._append_cost(seq_id, num_new_tokens)[0] <= self.num_free_blocks

    # ---- sequences --------------------------------------------------------------------------------
    def allocate(self, seq_id, num_tokens: int, cached_blocks: Sequence[int] = ()) -> list[int]:
        """Give a new sequence blocks for ``num_tokens`` tokens; return its block table.

        ``cached_blocks`` (from ``match_prefix``) become the table's first blocks, shared (reference +1); the
        rest are new. Raises ``OutOfBlocks`` (state unchanged) if they do not fit, ``ValueError`` if ``seq_id``
        exists or a block given as cached is not in the prefix cache.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks; append to it or free it first")
        cached = list(cached_blocks)
        if cached and (self.prefix_cache is None or not all(self.prefix_cache.is_cached(b) for b in cached)):
            raise ValueError(f"cached_blocks {cached} are not all in the prefix cache")
        need = self._allocate_cost(num_tokens, cached)
        if need > self.num_free_blocks:
            raise OutOfBlocks(need, self.num_free_blocks, seq_id)
        for b in cached:  # before taking new blocks, so that taking cannot evict them
            if self._ref[b] == 0:
                self.prefix_cache.claim(b)
            self._ref[b] += 1
        if cached:
            self.prefix_cache.touch(cached)
        self._tables[seq_id] = cached + [self._take() for _ in range(self.blocks_needed(num_tokens) - len(cached))]
        self._tokens[seq_id] = num_tokens
        return list(self._tables[seq_id])

    def append(self, seq_id, num_new_tokens: int) -> list[int]:
        """Extend a sequence by ``num_new_tokens`` tokens; return the slots they are to be written to.

        Raises ``OutOfBlocks`` (state unchanged) if the blocks it needs are not free.
        """
        need, cow = self._append_cost(seq_id, num_new_tokens)
        if need > self.num_free_blocks:
            raise OutOfBlocks(need, self.num_free_blocks, seq_id)
        table, start = self._tables[seq_id], self._tokens[seq_id]
        if cow:
            shared = table[-1]
            private = self._take()
            self._ref[shared] -= 1  # still > 0: another sequence holds it
            table[-1] = private
            self._copies.append((shared, private))
        table.extend(self._take() for _ in range(need - int(cow)))
        self._tokens[seq_id] = start + num_new_tokens
        return self.slot_mapping(seq_id, start, start + num_new_tokens)

    def fork(self, src_seq, dst_seq) -> list[int]:
        """Make ``dst_seq`` share every block of ``src_seq`` (reference counts +1); return its block table."""
        if dst_seq in self._tables:
            raise ValueError(f"sequence {dst_seq!r} already exists")
        table = self._table(src_seq)
        for b in table:
            self._ref[b] += 1
        self._tables[dst_seq] = list(table)
        self._tokens[dst_seq] = self._tokens[src_seq]
        return list(table)

    def free(self, seq_id) -> None:
        """Release a sequence; blocks no other sequence references return to the free pool (cached ones become
        evictable)."""
        table = self._table(seq_id)
        for b in reversed(table):  # the tail first: a prefix's last blocks are the first evicted among equals
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._release(b)
        del self._tables[seq_id], self._tokens[seq_id]
        if self.prefix_cache is not None:
            self.prefix_cache.forget(seq_id)

    # ---- prefix caching ---------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``token_ids`` (full blocks; [] without a cache)."""
        return self.prefix_cache.match(token_ids) if self.prefix_cache is not None else []

    def cache_blocks(self, seq_id, num_computed_tokens: int, token_ids) -> None:
        """Index the sequence's full blocks among its first ``num_computed_tokens`` tokens (K/V computed, or
        written in the step about to run); ``token_ids(start, end)`` gives its tokens. No-op without a cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.register(seq_id, self._table(seq_id), num_computed_tokens // self.block_size, token_ids)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use stay with their sequences, uncached)."""
        if self.prefix_cache is not None:
            for b in self.prefix_cache.clear():
                heapq.heappush(self._free, b)

    # ---- reading ----------------------------------------------------------------------------------
    def block_table(self, seq_id) -> list[int]:
        return list(self._table(seq_id))

    def num_tokens(self, seq_id) -> int:
        self._table(seq_id)
        return self._tokens[seq_id]

    def slot_mapping(self, seq_id, start: int, end: int) -> list[int]:
        """Pool slots of token positions ``[start, end)``: ``block_id * block_size + offset``."""
        table, n = self._table(seq_id), self._tokens[seq_id]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= n):
            raise ValueError(f"need 0 <= start <= end <= {n} (tokens of {seq_id!r}), got [{start}, {end})")
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def ref_count(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} outside the pool of {self.num_blocks}")
        return self._ref[block]

    @property
    def seq_ids(self) -> list:
        return list(self._tables)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._tables

    def live_blocks(self) -> list[int]:
        """Ids of blocks referenced by at least one sequence, ascending."""
        return [b for b, r in enumerate(self._ref) if r > 0]

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write block pairs (src, dst) queued by ``append``; the pool must copy them. Clears the queue."""
        out, self._copies = self._copies, []
        return out

    # ---- compaction -------------------------------------------------------------------------------
    def relocate(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Record that the K/V of live blocks ``src[i]`` now sit in free blocks ``dst[i]``: rewrite every block
        table, move reference counts, and return the sources to the free pool.

        Call after the pool copied the data (``servelab.kv.compaction`` does both).
        """
        src, dst = list(src), list(dst)
        self._check_relocation(src, dst)
        mapping = dict(zip(src, dst, strict=True))
        for table in self._tables.values():
            table[:] = [mapping.get(b, b) for b in table]
        self._copies = [(mapping.get(a, a), mapping.get(b, b)) for a, b in self._copies]
        for s, d in mapping.items():
            self._ref[d], self._ref[s] = self._ref[s], 0
        self._free = [b for b, r in enumerate(self._ref) if r == 0]  # sorted, hence a valid heap

    def _check_relocation(self, src: list[int], dst: list[int]) -> None:
        """Refuse a relocation that would corrupt the pool: every source live, every destination free, no overlap."""
        if self.prefix_cache is not None and len(self.prefix_cache):
            raise ValueError("compaction of a pool holding cached prefixes is not supported: reset the prefix cache")
        if len(src) != len(dst):
            raise ValueError(f"src and dst must have equal length, got {len(src)} and {len(dst)}")
        if len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise ValueError("src and dst must not repeat a block")
        if set(src) & set(dst):
            raise ValueError("a block cannot be both a source and a destination")
        for s, d in zip(src, dst, strict=True):
            if not (0 <= s < self.num_blocks and 0 <= d < self.num_blocks):
                raise IndexError(f"block pair ({s}, {d}) outside the pool of {self.num_blocks}")
            if self._ref[s] == 0:
                raise ValueError(f"source block {s} is not live")
            if self._ref[d] != 0:
                raise ValueError(f"destination block {d} is not free")

    # ---- internals --------------------------------------------------------------------------------
    def _take(self) -> int:
        if not self._free and self.prefix_cache is not None and self.prefix_cache.num_evictable:
            for b in self.prefix_cache.evict():  # the victim and its cached descendants no one references
                heapq.heappush(self._free, b)
        b = heapq.heappop(self._free)
        self._ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        """``b`` lost its last reference: evictable if cached, else free."""
        if self.prefix_cache is None or not self.prefix_cache.release(b):
            heapq.heappush(self._free, b)

    def _table(self, seq_id) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def __repr__(self) -> str:
        return (
            f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"used={self.num_used_blocks}, sequences={len(self._tables)})"
        )

    # ---- speculative decoding: rollback ----------------------------------------------------------
    def truncate(self, seq_id, num_tokens: int) -> list[int]:
        """Shrink a sequence to its first ``num_tokens`` tokens (rejected draft tokens are forgotten); the blocks past
        them lose a reference (freed when no other sequence holds them). Returns the blocks freed.

        The K/V of the dropped positions stay in the pool as garbage until overwritten: a rollback moves no bytes.
        """
        _check_count("num_tokens", num_tokens)
        table, n = self._table(seq_id), self._tokens[seq_id]
        if num_tokens > n:
            raise ValueError(f"cannot truncate sequence {seq_id!r} of {n} tokens to {num_tokens}")
        keep = self.blocks_needed(num_tokens)
        freed = []
        for b in table[keep:]:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._release(b)
                freed.append(b)
        del table[keep:]
        if self.prefix_cache is not None:
            self.prefix_cache.truncate(seq_id, num_tokens // self.block_size)
            if num_tokens % self.block_size and self._ref[table[-1]] == 1:  # its tail will be overwritten in place
                for b in self.prefix_cache.discard(table[-1]):
                    heapq.heappush(self._free, b)
        self._tokens[seq_id] = num_tokens
        return freed


def _check_count(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
