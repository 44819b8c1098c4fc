"""Prompts that share prefixes: what a prefix-affinity router keys on.

Each request's prompt starts with one of ``groups`` shared prefixes of ``prefix_tokens`` token ids (a system
prompt or few-shot block), chosen with Zipf(``alpha``) popularity, followed by its own random ids; prompts
shorter than the prefix are the prefix's first tokens. Deterministic given ``seed``.

Long capacity runs need only the group (``prefix_group``, which the router then keys on: the same as hashing
the prefix's tokens); ``materialize=True`` writes the ``prompt_ids`` themselves.
"""

from __future__ import annotations

import numpy as np

from servelab.errors import ParameterError
from servelab.loadgen.workload import Trace


def with_shared_prefixes(
    trace: Trace,
    *,
    groups: int,
    prefix_tokens: int,
    vocab: int = 32000,
    alpha: float = 1.0,
    seed: int = 0,
    materialize: bool = False,
) -> Trace:
    """``trace`` with a ``prefix_group`` column (and ``prompt_ids`` with ``materialize``), as described above."""
    for name, v in (("groups", groups), ("prefix_tokens", prefix_tokens), ("vocab", vocab)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive integer, got {v!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ParameterError(f"alpha must be a positive number, got {alpha!r}")
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, vocab, (groups, prefix_tokens))
    p = 1.0 / np.arange(1, groups + 1) ** alpha
    df = trace.frame.copy()
    group = rng.choice(groups, size=len(df), p=p / p.sum())
    if materialize:
        ids = []
        for g, n in zip(group, df["prompt_tokens"].to_numpy(), strict=True):
            head = prefixes[g, : min(n, prefix_tokens)]
            tail = rng.integers(0, vocab, max(0, n - prefix_tokens))
            ids.append(np.concatenate([head, tail]).tolist())
        df["prompt_ids"] = ids
    df["prefix_group"] = group
    return Trace(df, source=f"{trace.source}; {groups} shared {prefix_tokens}-token prefixes, Zipf {alpha:g}")
