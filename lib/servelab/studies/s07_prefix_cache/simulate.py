"""Sweep prefix-cache policies over Zipf exponents and capacities: tidy hit rates next to the optimum."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
from tqdm import tqdm

from servelab.studies.s07_prefix_cache.optimum import belady_hit_rate, static_block_optimum, static_optimum
from servelab.studies.s07_prefix_cache.policies import LFU, LRU
from servelab.studies.s07_prefix_cache.radix import RadixLRU
from servelab.studies.s07_prefix_cache.workload import ZipfWorkload, check_alpha, check_int, shared_prefixes

# name -> what it caches; "belady" is the offline MIN on the same stream, a reference rather than a policy
POLICY_NAMES = ("lru", "lfu", "lfu_perfect", "radix", "belady")


def _run(cache, requests) -> float:
    hit = total = 0
    for r in requests:
        h = cache.access(r)
        hit += h.blocks_hit
        total += h.blocks_total
    return hit / total


def hit_rates(
    alphas: Iterable[float],
    capacities: Iterable[int],
    policies: Iterable[str] = ("lru", "lfu"),
    n_prefixes: int = 100,
    n_requests: int = 20_000,
    seed: int = 0,
    *,
    n_shared: int = 4,
    shared_blocks: int = 2,
    own_blocks: int = 2,
    block_size: int = 16,
    progress: bool = True,
) -> pd.DataFrame:
    """Hit rate of each policy for each Zipf exponent α and capacity, on one seeded stream per α.

    Every policy sees the same stream of ``n_requests`` requests for a given α (cold start included).
    ``capacity`` is in whole-prefix slots. For ``radix`` each prefix is a token sequence (system prompt
    ``i % n_shared`` of ``shared_blocks`` blocks, then ``own_blocks`` blocks of its own), the cache holds
    ``capacity × (shared_blocks + own_blocks)`` blocks (the memory of ``capacity`` whole prefixes), and the hit
    rate counts blocks.

    ``belady`` is the offline MIN on the same stream (it sees the future, so it may beat ``optimum``).

    Returns one row per (policy, alpha, capacity): ``unit`` ("prefix" or "block"), ``capacity_blocks``
    (the memory in blocks, ``capacity × blocks per prefix``, for every policy), ``hit_rate``, and
    ``optimum``: the static optimum in the row's unit (top-k prefixes, or the best fixed set of blocks for
    radix), the expected hit rate of a cache that knows the popularities but not the stream.
    """
    alphas = [check_alpha(a) for a in alphas]
    capacities = [check_int("capacity", c) for c in capacities]
    policies = list(policies)
    for name in policies:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    if not alphas or not capacities or not policies:
        raise ValueError("alphas, capacities and policies must each hold at least one value")
    n_prefixes = check_int("n_prefixes", n_prefixes)
    n_requests = check_int("n_requests", n_requests)
    seed = check_int("seed", seed, lo=0)
    prefixes = shared_prefixes(n_prefixes, n_shared, shared_blocks, own_blocks, block_size)  # validates too
    blocks_per_prefix = shared_blocks + own_blocks

    rows = []
    bar = tqdm(total=len(alphas) * len(capacities) * len(policies), desc="prefix cache", disable=not progress)
    for i, alpha in enumerate(alphas):
        workload = ZipfWorkload(alpha, n_prefixes)
        # a stream per (seed, position of α): appending an α leaves the earlier streams unchanged
        keys = workload.keys(n_requests, np.random.default_rng([seed, i])).tolist()
        for capacity in capacities:
            for name in policies:
                cap_blocks = capacity * blocks_per_prefix
                if name == "radix":
                    rate = _run(RadixLRU(cap_blocks, block_size), (prefixes[k] for k in keys))
                    opt = static_block_optimum(prefixes, workload.probabilities, cap_blocks, block_size)
                    unit = "block"
                else:
                    if name == "belady":
                        rate = belady_hit_rate(keys, capacity)
                    else:
                        cache = LRU(capacity) if name == "lru" else LFU(capacity, remember=name == "lfu_perfect")
                        rate = _run(cache, keys)
                    opt = static_optimum(alpha, n_prefixes, capacity)
                    unit = "prefix"
                rows.append(
                    dict(
                        policy=name,
                        alpha=alpha,
                        capacity=capacity,
                        unit=unit,
                        capacity_blocks=cap_blocks,
                        hit_rate=rate,
                        optimum=opt,
                    )
                )
                bar.update()
    bar.close()
    return pd.DataFrame(rows)
