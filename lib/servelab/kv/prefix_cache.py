"""Automatic prefix caching: full KV blocks indexed by the tokens they hold and every token before them.

A block's K/V depend on its own tokens and on every earlier token of the sequence, so a block is cached under
the key ``(parent, tokens)``: ``parent`` names the cached block before it (a chain, as in vLLM's block hashes,
which makes the index a radix tree over blocks, as in SGLang). Parents are named by an id that is never
reused, not by a hash, so two different prefixes can never share a key: a lookup finds a block only if the
whole prefix up to and including it is equal, token for token.

Only full blocks are cached; the block manager (``servelab.kv.block_manager``) shares them between sequences
with reference counts. A cached block that no sequence references any more keeps its K/V and waits in the
*evictable* set; it is reused if a later request has the same prefix, or recycled when the free list is empty:
least recently released first (``lru``), or least often hit first, then least recently released (``lfu``).
Evicting a block drops its cached descendants too: their prefix is gone, so no lookup could reach them.

Hit rate: tokens found in the cache over tokens looked up, counted by the scheduler at each admission
(``record_lookup``); block hits likewise.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from servelab.errors import ParameterError

EVICTION_POLICIES = ("lru", "lfu")
ROOT = 0  # the parent id of a sequence's first block


@dataclass(slots=True)
class _Entry:
    uid: int  # never reused: children name their parent by it
    block: int  # pool block holding the K/V
    key: tuple  # (parent uid, token ids of the block)
    hits: int = 1  # times a request reused it (LFU's count), 1 when first cached
    children: set = field(default_factory=set)


class _LRUEvictable:
    """Unreferenced cached blocks, least recently released first."""

    def __init__(self):
        self._order: OrderedDict[int, None] = OrderedDict()

    def add(self, block: int, entry: _Entry) -> None:
        self._order[block] = None

    def remove(self, block: int) -> None:
        del self._order[block]

    def pop(self) -> int:
        return self._order.popitem(last=False)[0]

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def __len__(self) -> int:
        return len(self._order)


class _LFUEvictable:
    """Unreferenced cached blocks, fewest hits first, least recently released among equals (a lazy heap)."""

    def __init__(self):
        self._heap: list[tuple[int, int, int]] = []
        self._live: dict[int, tuple[int, int]] = {}  # block -> (hits, tick) of its valid heap entry
        self._tick = itertools.count()

    def add(self, block: int, entry: _Entry) -> None:
        key = (entry.hits, next(self._tick))
        self._live[block] = key
        heapq.heappush(self._heap, (*key, block))
        if len(self._heap) > 4 * len(self._live) + 64:  # drop stale entries so the heap stays O(size)
            self._heap = [(h, t, b) for b, (h, t) in self._live.items()]
            heapq.heapify(self._heap)

    def remove(self, block: int) -> None:
        del self._live[block]

    def pop(self) -> int:
        while True:
            h, t, b = heapq.heappop(self._heap)
            if self._live.get(b) == (h, t):
                del self._live[b]
                return b

    def __contains__(self, block: int) -> bool:
        return block in self._live

    def __len__(self) -> int:
        return len(self._live)


@dataclass(slots=True)
class _Chain:
    """How far a sequence's blocks are cached: ``count`` leading blocks, the last under id ``parent``."""

    count: int = 0
    parent: int = ROOT


class PrefixCache:
    """The index of cached blocks and the set of evictable ones. The block manager owns the blocks and calls
    ``match``, ``register``, ``touch``, ``release``, ``claim`` and ``evict``; see the module docstring."""

    def __init__(self, block_size: int, eviction: str = "lru"):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ParameterError(f"block_size must be a positive integer, got {block_size!r}")
        if eviction not in EVICTION_POLICIES:
            raise ParameterError(f"prefix eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        self.block_size, self.eviction = block_size, eviction
        self._index: dict[tuple, _Entry] = {}  # (parent uid, tokens) -> entry
        self._by_uid: dict[int, _Entry] = {}
        self._by_block: dict[int, _Entry] = {}
        self._chains: dict[Hashable, _Chain] = {}
        self._uids = itertools.count(ROOT + 1)
        self._evictable = _LRUEvictable() if eviction == "lru" else _LFUEvictable()
        self.queried_tokens = self.hit_tokens = 0
        self.queried_blocks = self.hit_blocks = 0
        self.evictions = 0

    # ---- lookup and registration ------------------------------------------------------------------
    def match(self, token_ids: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``token_ids``, in order (full blocks only; no side effects)."""
        bs, parent, out = self.block_size, ROOT, []
        for start in range(0, len(token_ids) - bs + 1, bs):
            e = self._index.get((parent, tuple(token_ids[start : start + bs])))
            if e is None:
                break
            out.append(e.block)
            parent = e.uid
        return out

    def register(
        self,
        seq_id: Hashable,
        table: Sequence[int],
        num_full_blocks: int,
        token_ids: Callable[[int, int], Sequence[int]],
    ) -> None:
        """Cache the first ``num_full_blocks`` blocks of ``table`` (their K/V are, or are being, computed in
        this step); ``token_ids(start, end)`` gives the sequence's tokens. Blocks cached already are skipped.

        A block whose prefix is already cached in another block (two requests computed it at once) stays
        private; the chain continues through the cached one, so the sequence's later blocks can be shared.
        """
        chain = self._chains.get(seq_id)
        if chain is None:
            chain = self._chains[seq_id] = _Chain()
        bs = self.block_size
        while chain.count < num_full_blocks:
            if chain.parent != ROOT and chain.parent not in self._by_uid:
                return  # an earlier block of this prefix was evicted: nothing after it is reachable
            j = chain.count
            key = (chain.parent, tuple(token_ids(j * bs, (j + 1) * bs)))
            e = self._index.get(key)
            if e is None:
                block = table[j]
                if block in self._by_block:
                    raise RuntimeError(f"block {block} is cached under another prefix")  # a bookkeeping bug
                e = _Entry(next(self._uids), block, key)
                self._index[key] = self._by_uid[e.uid] = self._by_block[block] = e
                if chain.parent != ROOT:
                    self._by_uid[chain.parent].children.add(e.uid)
            chain.count, chain.parent = j + 1, e.uid

    def forget(self, seq_id: Hashable) -> None:
        """The sequence gave its blocks back (finished, preempted or aborted)."""
        self._chains.pop(seq_id, None)

    def record_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        """Count one admission: ``hit_tokens`` of the ``queried_tokens`` it looked up were cached."""
        self.queried_tokens += queried_tokens
        self.hit_tokens += hit_tokens
        self.queried_blocks += queried_tokens // self.block_size
        self.hit_blocks += hit_tokens // self.block_size

    # ---- the evictable set (called by the block manager) ----------------------------------------------
    def is_cached(self, block: int) -> bool:
        return block in self._by_block

    def touch(self, blocks: Sequence[int]) -> None:
        """A request reuses these cached blocks (LFU counts hits)."""
        for b in blocks:
            self._by_block[b].hits += 1

    def release(self, block: int) -> bool:
        """The block's last reference went away; whether it stays cached (evictable) rather than free."""
        e = self._by_block.get(block)
        if e is None:
            return False
        self._evictable.add(block, e)
        return True

    def claim(self, block: int) -> None:
        """An evictable block is referenced again."""
        self._evictable.remove(block)

    def evict(self) -> list[int]:
        """Drop the next victim from the cache, and its cached descendants; the blocks now free (the victim
        first, then the unreferenced descendants). Referenced descendants stay with their sequences, uncached."""
        victim = self._evictable.pop()
        self.evictions += 1
        return [victim] + self._drop_subtree(self._by_block[victim])

    def discard(self, block: int) -> list[int]:
        """Uncache a referenced block whose K/V are about to change (a sequence was truncated into it), and its
        descendants; the blocks now free (unreferenced descendants)."""
        e = self._by_block.get(block)
        return self._drop_subtree(e) if e is not None else []

    def truncate(self, seq_id: Hashable, num_full_blocks: int) -> None:
        """The sequence now has only ``num_full_blocks`` full blocks: its chain is walked again at the next
        ``register`` (the blocks after them will hold other tokens)."""
        chain = self._chains.get(seq_id)
        if chain is not None and chain.count > num_full_blocks:
            chain.count, chain.parent = 0, ROOT

    def _drop_subtree(self, top: _Entry) -> list[int]:
        freed, stack = [], [top]
        while stack:
            e = stack.pop()
            self._drop(e)
            if e is not top and e.block in self._evictable:
                self._evictable.remove(e.block)
                freed.append(e.block)
            stack.extend(self._by_uid[c] for c in e.children)
        return freed

    def clear(self) -> list[int]:
        """Forget every cached prefix; the evictable blocks, which are now free."""
        freed = [b for b in self._by_block if b in self._evictable]
        for b in freed:
            self._evictable.remove(b)
        self._index.clear(), self._by_uid.clear(), self._by_block.clear()
        for chain in self._chains.values():  # running sequences start their chains again, at their next block
            chain.count, chain.parent = 0, ROOT
        return freed

    def _drop(self, e: _Entry) -> None:
        del self._index[e.key], self._by_uid[e.uid], self._by_block[e.block]
        parent = self._by_uid.get(e.key[0])
        if parent is not None:
            parent.children.discard(e.uid)

    # ---- reading ----------------------------------------------------------------------------------
    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def __len__(self) -> int:
        """Cached blocks, referenced or not."""
        return len(self._by_block)

    @property
    def hit_rate(self) -> float:
        """Cached tokens / looked-up tokens over all admissions so far (0 before any)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0

    def stats(self) -> dict:
        return {
            "prefix_hit_rate": self.hit_rate,
            "prefix_block_hit_rate": self.block_hit_rate,
            "prefix_queried_tokens": self.queried_tokens,
            "prefix_hit_tokens": self.hit_tokens,
            "prefix_cached_blocks": len(self),
            "prefix_evictable_blocks": self.num_evictable,
            "prefix_evictions": self.evictions,
            "prefix_eviction": self.eviction,
        }
