"""Prefix request streams: Zipf(α) popularity over N distinct prefixes, as keys or as token sequences.

Prefix ``i`` (0-based) is the ``i+1``-th most popular: p_i ∝ (i+1)^-α. The token variant gives the radix
cache something to share: prefix ``i`` is system prompt ``i % n_shared`` followed by its own few-shot blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def check_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def check_alpha(alpha) -> float:
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float, np.floating))
        or not np.isfinite(alpha)
        or alpha <= 0
    ):
        raise ValueError(f"alpha (Zipf exponent) must be a finite number > 0, got {alpha!r}")
    return float(alpha)


def zipf_probabilities(alpha: float, n_prefixes: int) -> np.ndarray:
    """p_i ∝ (i+1)^-α for i in 0..N-1, most popular first; sums to 1."""
    alpha, n = check_alpha(alpha), check_int("n_prefixes", n_prefixes)
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return w / w.sum()


@dataclass(frozen=True)
class ZipfWorkload:
    """A stationary stream of prefix ids drawn i.i.d. from Zipf(α) over ``n_prefixes`` prefixes."""

    alpha: float
    n_prefixes: int

    def __post_init__(self):
        check_alpha(self.alpha)
        check_int("n_prefixes", self.n_prefixes)

    @property
    def probabilities(self) -> np.ndarray:
        return zipf_probabilities(self.alpha, self.n_prefixes)

    def keys(self, n_requests: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        """``n_requests`` prefix ids (int64, 0 = most popular); ``rng`` a Generator or a seed."""
        n = check_int("n_requests", n_requests)
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return rng.choice(self.n_prefixes, size=n, p=self.probabilities)


def shared_prefixes(
    n_prefixes: int, n_shared: int = 1, shared_blocks: int = 1, own_blocks: int = 1, block_size: int = 16
) -> list[tuple[int, ...]]:
    """Token sequences for ``n_prefixes`` prefixes: system prompt ``i % n_shared`` (``shared_blocks`` blocks)
    then ``own_blocks`` blocks of the prefix's own few-shot examples. Token ids are distinct per block, so two
    prefixes share exactly their system prompt when they are in the same group. ``shared_blocks=0`` gives
    prefixes that share nothing."""
    n = check_int("n_prefixes", n_prefixes)
    g = check_int("n_shared", n_shared)
    sb = check_int("shared_blocks", shared_blocks, lo=0)
    ob = check_int("own_blocks", own_blocks, lo=0)
    bs = check_int("block_size", block_size)
    if sb + ob < 1:
        raise ValueError("a prefix needs at least one block: shared_blocks + own_blocks must be >= 1")
    system = [tuple(range(j * sb * bs, (j + 1) * sb * bs)) for j in range(g)]
    base = g * sb * bs
    own = [tuple(range(base + i * ob * bs, base + (i + 1) * ob * bs)) for i in range(n)]
    return [system[i % g] + own[i] for i in range(n)]
