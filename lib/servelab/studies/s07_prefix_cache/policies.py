"""Whole-prefix cache policies, capacity in slots: ``LRU`` and ``LFU``; and ``Hit``, what every policy's
``access(key_or_tokens)`` returns (the block-granular ``RadixLRU`` lives in ``radix``)."""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from servelab.studies.s07_prefix_cache.workload import check_int


@dataclass(frozen=True, slots=True)
class Hit:
    """What one access found: ``blocks_hit`` of ``blocks_total`` reused (1 of 1 for a whole-prefix hit)
    and what it evicted (keys, or token blocks for the radix cache)."""

    blocks_hit: int
    blocks_total: int
    evicted: tuple = ()

    @property
    def hit(self) -> bool:
        return self.blocks_total > 0 and self.blocks_hit == self.blocks_total


class LRU:
    """Whole-prefix cache of ``capacity`` slots; evicts the least recently used prefix."""

    unit = "prefix"

    def __init__(self, capacity: int):
        self.capacity = check_int("capacity", capacity)
        self._cache: OrderedDict[Hashable, None] = OrderedDict()

    def access(self, key: Hashable) -> Hit:
        if key in self._cache:
            self._cache.move_to_end(key)
            return Hit(1, 1)
        evicted = ()
        if len(self._cache) >= self.capacity:
            evicted = (self._cache.popitem(last=False)[0],)
        self._cache[key] = None
        return Hit(0, 1, evicted)

    def keys(self) -> list:
        """Cached keys, next victim first."""
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class LFU:
    """Whole-prefix cache of ``capacity`` slots; evicts the least frequently used prefix, the least recently
    used among equals.

    By default counts live only while a prefix is cached: a prefix re-enters at count 1 and is the next
    victim, so one slot churns and a k-slot cache behaves like the top k-1 plus a little. ``remember=True``
    is "perfect LFU": counts persist across evictions and a missed prefix is admitted only if its count is
    at least the smallest cached count (else bypassed), so on a stationary stream it converges to the
    static top-k.
    """

    unit = "prefix"

    def __init__(self, capacity: int, remember: bool = False):
        self.capacity = check_int("capacity", capacity)
        self.remember = bool(remember)
        self._state: dict[Hashable, tuple[int, int]] = {}  # key -> (count, last access tick)
        self._history: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []  # lazy: stale entries skipped on pop
        self._tick = itertools.count()

    def _touch(self, key: Hashable, count: int) -> None:
        t = next(self._tick)
        self._state[key] = (count, t)
        heapq.heappush(self._heap, (count, t, key))
        if len(self._heap) > 4 * self.capacity + 64:  # drop stale entries so the heap stays O(capacity)
            self._heap = [(c, t, k) for k, (c, t) in self._state.items()]
            heapq.heapify(self._heap)

    def _peek(self) -> tuple[int, int, Hashable]:
        while True:
            c, t, k = self._heap[0]
            if self._state.get(k) == (c, t):
                return c, t, k
            heapq.heappop(self._heap)

    def _evict(self) -> Hashable:
        k = self._peek()[2]
        heapq.heappop(self._heap)
        del self._state[k]
        return k

    def access(self, key: Hashable) -> Hit:
        if key in self._state:
            self._touch(key, self._state[key][0] + 1)
            if self.remember:
                self._history[key] += 1
            return Hit(1, 1)
        count = 1
        if self.remember:
            count = self._history[key] = self._history.get(key, 0) + 1
        full = len(self._state) >= self.capacity
        if full and self.remember and count < self._peek()[0]:
            return Hit(0, 1)  # bypass: less popular than everything cached
        evicted = (self._evict(),) if full else ()
        self._touch(key, count)
        return Hit(0, 1, evicted)

    def keys(self) -> list:
        """Cached keys, next victim first."""
        return [k for k, _ in sorted(self._state.items(), key=lambda kv: kv[1])]

    def count(self, key: Hashable) -> int:
        """The access count eviction compares for ``key`` (0 if not cached)."""
        return self._state.get(key, (0, 0))[0]

    def __len__(self) -> int:
        return len(self._state)
