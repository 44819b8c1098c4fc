"""Offline references for prefix-cache hit rates.

On a stationary i.i.d. stream the best any cache of k slots can do *in expectation* is to hold the k most
popular prefixes for ever: hit rate sum_{i<k} p_i. Belady's MIN (evict the prefix used farthest in the future)
is the optimum for one realised stream; it knows the future, so it can beat the static top-k on a finite stream.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from servelab.studies.s07_prefix_cache.workload import check_int, zipf_probabilities


def static_optimum(alpha: float, n_prefixes: int, capacity: int) -> float:
    """Expected hit rate of holding the ``capacity`` most popular of ``n_prefixes`` Zipf(α) prefixes."""
    k = check_int("capacity", capacity)
    return float(zipf_probabilities(alpha, n_prefixes)[:k].sum())


def static_block_optimum(
    prefixes: Sequence[Sequence[int]], probabilities: Sequence[float], capacity: int, block_size: int = 16
) -> float:
    """Expected block hit rate (blocks reused / blocks requested) of the best fixed set of ``capacity`` cached
    blocks, for requests drawing prefix ``i`` with probability ``probabilities[i]``.

    A block's value is the probability that a request contains it. A block is worth at least as much as any
    block below it, so taking the most valuable blocks (shallower first among equals) is ancestor-closed: a
    valid prefix tree, and the best one.
    """
    cap, bs = check_int("capacity", capacity), check_int("block_size", block_size)
    p = np.asarray(probabilities, dtype=np.float64)
    if len(p) != len(prefixes):
        raise ValueError(f"{len(prefixes)} prefixes but {len(p)} probabilities")
    value: dict[tuple, float] = {}
    expected_blocks = 0.0
    for tokens, pi in zip(prefixes, p, strict=True):
        n_blocks = len(tokens) // bs
        expected_blocks += pi * n_blocks
        for j in range(1, n_blocks + 1):
            path = tuple(tokens[: j * bs])
            value[path] = value.get(path, 0.0) + pi
    if expected_blocks == 0:
        raise ValueError("no prefix has a full block")
    best = sorted(value.items(), key=lambda kv: (-kv[1], len(kv[0])))[:cap]
    return float(sum(v for _, v in best) / expected_blocks)


def belady_hit_rate(keys: Sequence, capacity: int) -> float:
    """Hit rate of Belady's MIN on the stream ``keys`` with ``capacity`` slots, bypass allowed: on a miss
    the incoming prefix is cached only if it is used again sooner than some cached prefix. O(n log k)."""
    cap = check_int("capacity", capacity)
    keys = list(keys)
    n = len(keys)
    if n == 0:
        raise ValueError("keys must not be empty")
    next_use = [n] * n
    last: dict = {}
    for t in range(n - 1, -1, -1):
        next_use[t] = last.get(keys[t], n + t)  # never again: unique "infinity" so farthest is well defined
        last[keys[t]] = t
    cached: dict = {}  # key -> its next use
    heap: list[tuple[int, object]] = []  # (-next use, key), lazy
    hits = 0
    for t, k in enumerate(keys):
        nu = next_use[t]
        if k in cached:
            hits += 1
        elif len(cached) >= cap:
            while True:  # farthest-used cached prefix
                neg, victim = heap[0]
                if cached.get(victim) == -neg:
                    break
                heapq.heappop(heap)
            if nu >= -neg:
                continue  # bypass: the incoming prefix is the one used farthest away
            heapq.heappop(heap)
            del cached[victim]
        cached[k] = nu
        heapq.heappush(heap, (-nu, k))
    return hits / n
