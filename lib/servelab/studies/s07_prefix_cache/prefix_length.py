"""F7.1: time to first token with a shared prefix of p tokens cached or not, p = 64 … 8,192.

Each point is one request: a prefix of ``p`` random tokens (a system prompt, a document) and a question of
``suffix`` tokens. Cached: another request with the same prefix and a different question ran before (the
cache holds the prefix's full blocks); uncached: caching off, the whole prompt is prefilled.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

from servelab.engine import Engine
from servelab.measure import Roofline
from servelab.studies.common.budget import SKIPPED, Budget
from servelab.studies.s07_prefix_cache.first_token import MODES, failure_status, random_tokens, recover, time_requests


def prefill_floor_ms(shape, roof: Roofline, new_tokens: int, context: int, dtype_bytes: int, batch: int = 1) -> float:
    """Roofline floor (ms) of prefilling ``new_tokens`` per sequence after ``context`` cached ones, ``batch`` sequences:
    the FLOPs at the measured matmul ceiling, or weights + K/V read and written at the measured copy bandwidth."""
    flops = shape.prefill_flops(new_tokens, context, batch=batch)
    nbytes = shape.prefill_bytes(new_tokens, context, batch=batch, dtype_bytes=dtype_bytes)
    return float(roof.floor_ms(flops, nbytes))


def prefix_length_sweep(
    engine: Engine,
    prefix_lengths,
    suffix_tokens: int,
    roof: Roofline | None = None,
    *,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
    budget: Budget | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (prefix length, mode): TTFT ``median_ms`` (p25/p75, CI), the tokens computed and served from
    the cache, the engine steps' wall time, the roofline floor of the prefill computed, and ``status``
    (points left when ``budget`` is spent are skipped)."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.shape.vocab
    shape, dtype_bytes = engine.model.shape, engine.dtype.itemsize
    rows = []
    points = [(p, m) for p in prefix_lengths for m in MODES]
    for p, mode in tqdm(points, desc="F7.1 prefix lengths", disable=not progress):
        prefix = random_tokens(rng, p, vocab)
        prompt = prefix + random_tokens(rng, suffix_tokens, vocab)
        primer = prefix + random_tokens(rng, suffix_tokens, vocab)
        row = {"prefix_tokens": p, "suffix_tokens": suffix_tokens, "prompt_tokens": len(prompt), "mode": mode}
        if budget is not None and budget.spent():
            rows.append({**row, "status": SKIPPED})
            continue
        try:
            row.update(time_requests(engine, [prompt], mode, primer=primer, warmup=warmup, repeats=repeats))
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - one failed point must not end the sweep
            recover(engine)
            row["status"] = failure_status(e)
        if roof is not None:
            context = row.get("cached_tokens", 0) if mode == "cached" else 0
            new = len(prompt) - context
            row["floor_ms"] = prefill_floor_ms(shape, roof, new, context, dtype_bytes)
            if row["status"] == "ok":
                row["pct_of_floor"] = 100.0 * row["floor_ms"] / row["median_ms"]
        rows.append(row)
    return pd.DataFrame(rows)
