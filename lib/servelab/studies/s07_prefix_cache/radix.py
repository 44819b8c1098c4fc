"""A radix-tree prefix cache at block granularity, LRU eviction of unreferenced leaves (as in SGLang).

A request reuses the longest cached run of its full blocks; prefixes sharing a system prompt share its
nodes, so the prompt is stored once. Capacity is in blocks. Eviction only ever removes a leaf that no running
request holds, least recently used first; removing a leaf can make its parent the next candidate.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.studies.s07_prefix_cache.policies import Hit
from servelab.studies.s07_prefix_cache.workload import check_int


class _Node:
    __slots__ = ("block", "parent", "children", "ref", "last")

    def __init__(self, block: tuple, parent: _Node | None):
        self.block, self.parent = block, parent  # parent None: the root, or a node evicted from the tree
        self.children: dict[tuple, _Node] = {}
        self.ref = 0  # running requests holding this block (SGLang's lock_ref); never evicted while > 0
        self.last = -1  # tick of the last access


@dataclass
class Lease:
    """The blocks one running request pins in a ``RadixLRU``; give it back with ``release``."""

    nodes: list = field(repr=False)
    released: bool = False


class RadixLRU:
    """Block-granular prefix tree of at most ``capacity`` blocks of ``block_size`` tokens.

    Only full blocks are cached (a trailing partial block is recomputed, as in vLLM and SGLang). Each node is
    one block and a path from the root is a cached prefix. ``access`` models a request that finishes at once;
    ``acquire``/``release`` one that runs for a while and pins its blocks meanwhile.
    """

    unit = "block"

    def __init__(self, capacity: int, block_size: int = 16):
        self.capacity = check_int("capacity", capacity)
        self.block_size = check_int("block_size", block_size)
        self.root = _Node((), None)
        self.root.ref = 1
        self._size = 0
        self._tick = itertools.count()
        self._seq = itertools.count()  # heap tie-break, so nodes are never compared
        # candidate victims (last, seq, node), lazy: an entry is checked when popped, and a node is pushed
        # again whenever it becomes an unreferenced leaf
        self._leaves: list[tuple[int, int, _Node]] = []

    def access(self, tokens: Sequence[int]) -> Hit:
        """Reuse the longest cached block prefix of ``tokens`` and cache the rest, evicting as needed.
        Blocks that find no room (every leaf referenced) count as misses and are not cached."""
        hit, held = self._access(tokens)
        self._unpin(held)
        return hit

    def acquire(self, tokens: Sequence[int]) -> tuple[Hit, Lease]:
        """``access``, and keep the blocks of ``tokens`` now cached pinned until ``release(lease)``."""
        hit, held = self._access(tokens)
        return hit, Lease(held)

    def release(self, lease: Lease) -> None:
        if lease.released:
            raise ValueError("lease already released")
        lease.released = True
        self._unpin(lease.nodes)

    def referenced(self, tokens: Sequence[int]) -> list[int]:
        """Reference counts along the cached path of ``tokens``."""
        return [n.ref for n in self._match(self._blocks(tokens))]

    def cached_blocks(self, tokens: Sequence[int]) -> int:
        """How many leading full blocks of ``tokens`` are cached now (no side effects)."""
        return len(self._match(self._blocks(tokens)))

    def __len__(self) -> int:
        return self._size

    def _blocks(self, tokens: Sequence[int]) -> list[tuple]:
        bs = self.block_size
        return [tuple(tokens[i : i + bs]) for i in range(0, len(tokens) - bs + 1, bs)]

    def _match(self, blocks: list[tuple]) -> list[_Node]:
        path, node = [], self.root
        for b in blocks:
            node = node.children.get(b)
            if node is None:
                break
            path.append(node)
        return path

    def _access(self, tokens: Sequence[int]) -> tuple[Hit, list[_Node]]:
        blocks = self._blocks(tokens)
        t = next(self._tick)
        held = self._match(blocks)
        n_hit = len(held)
        for n in held:
            n.last = t
            n.ref += 1  # pinned while we insert, so our own prefix is not evicted under us
        node = held[-1] if held else self.root
        evicted = []
        for b in blocks[n_hit:]:
            if self._size >= self.capacity:
                victim = self._evict_one()
                if victim is None:
                    break
                evicted.append(victim)
            child = _Node(b, node)
            child.last, child.ref = t, 1
            node.children[b] = child
            self._size += 1
            held.append(child)
            node = child
        return Hit(n_hit, len(blocks), tuple(evicted)), held

    def _unpin(self, nodes: list[_Node]) -> None:
        for n in nodes:
            n.ref -= 1
            if n.ref == 0 and not n.children and n.parent is not None:
                self._push(n)

    def _push(self, n: _Node) -> None:
        heapq.heappush(self._leaves, (n.last, next(self._seq), n))
        if len(self._leaves) > 4 * self._size + 64:  # drop stale entries so the heap stays O(size)
            self._leaves = [e for e in self._leaves if self._evictable(*e)]
            heapq.heapify(self._leaves)

    @staticmethod
    def _evictable(last: int, _seq: int, n: _Node) -> bool:
        return n.parent is not None and n.ref == 0 and not n.children and n.last == last

    def _evict_one(self) -> tuple | None:
        """Remove the least recently used unreferenced leaf; None when there is none."""
        while self._leaves:
            entry = heapq.heappop(self._leaves)
            if not self._evictable(*entry):
                continue
            n = entry[2]
            p = n.parent
            del p.children[n.block]
            n.parent = None
            self._size -= 1
            if p.parent is not None and p.ref == 0 and not p.children:
                self._push(p)
            return n.block
        return None
