"""F7.3: n requests sharing a prefix of p tokens, prefilled with one shared prefix or n independent ones.

The n requests (the prefix, then a suffix of their own) arrive together on an empty cache. Shared: caching
on; the scheduler admits them in one step, the first computes the prefix and the others share its blocks in
that same step (each layer writes the step's K/V before any attention reads the pool), so only their
suffixes are computed, but each attends over the prefix read back from the pool. Independent: caching off,
n × (p + suffix) tokens. The breakeven n is the smallest batch from which sharing is never slower.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

from servelab.engine import Engine
from servelab.measure import Roofline
from servelab.studies.common.budget import SKIPPED, Budget
from servelab.studies.s07_prefix_cache.first_token import failure_status, random_tokens, recover, time_requests

SHARING = {"shared": "cached", "independent": "uncached"}  # this study's names -> the cache mode timed


def shared_floor_ms(shape, roof: Roofline, prefix: int, suffix: int, n: int, dtype_bytes: int) -> float:
    """Roofline floor (ms) of the shared prefill: one prefix + suffix, then n - 1 suffixes over the cached prefix."""
    flops = shape.prefill_flops(prefix + suffix) + (n - 1) * shape.prefill_flops(suffix, prefix)
    kv = shape.kv_bytes_per_token(dtype_bytes)
    nbytes = shape.weight_bytes(dtype_bytes) + kv * (prefix + suffix) + (n - 1) * kv * (prefix + suffix)
    return float(roof.floor_ms(flops, nbytes))


def batch_sharing_sweep(
    engine: Engine,
    prefixes,
    batches,
    suffix_tokens: int,
    roof: Roofline | None = None,
    *,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
    budget: Budget | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (prefix length, n, sharing): time until all n requests have their first token (ms),
    ``ms_per_request``, tokens computed and served from the cache, the roofline floor, ``status``."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.shape.vocab
    shape, dtype_bytes = engine.model.shape, engine.dtype.itemsize
    rows = []
    points = [(p, n, s) for p in prefixes for n in batches for s in SHARING]
    for p, n, sharing in tqdm(points, desc="F7.3 batch sharing", disable=not progress):
        prefix = random_tokens(rng, p, vocab)
        prompts = [prefix + random_tokens(rng, suffix_tokens, vocab) for _ in range(n)]
        row = {"prefix_tokens": p, "suffix_tokens": suffix_tokens, "n": n, "sharing": sharing}
        if budget is not None and budget.spent():
            rows.append({**row, "status": SKIPPED})
            continue
        try:
            row.update(time_requests(engine, prompts, SHARING[sharing], warmup=warmup, repeats=repeats))
            row["ms_per_request"] = row["median_ms"] / n
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001
            recover(engine)
            row["status"] = failure_status(e)
        if roof is not None:
            row["floor_ms"] = (
                shared_floor_ms(shape, roof, p, suffix_tokens, n, dtype_bytes)
                if sharing == "shared"
                else float(
                    roof.floor_ms(
                        shape.prefill_flops(p + suffix_tokens, batch=n),
                        shape.prefill_bytes(p + suffix_tokens, batch=n, dtype_bytes=dtype_bytes),
                    )
                )
            )
        rows.append(row)
    return pd.DataFrame(rows)
