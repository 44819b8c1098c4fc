"""The analytical model of speculative decoding (Leviathan, Kalman and Matias 2023, section 3).

With α the probability that the target keeps a drafted token (assumed the same for every position, drafts
independent) and γ drafts per round, a round emits on average

    E[tokens] = (1 − α^(γ+1)) / (1 − α)

tokens for one target forward. If a draft step costs c target steps (c = T_draft / T_target) and the target's
forward of γ + 1 tokens costs what one decode step costs, the wall-time improvement over plain decoding is

    improvement = (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

α itself is estimated from the rounds: a round is a run of Bernoulli(α) trials stopped at the first
rejection or after γ successes, so the maximum-likelihood estimate is accepted / (accepted + rejections).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq


def _check(alpha, gamma, c=None):
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if np.any(np.asarray(gamma) < 1):
        raise ValueError(f"gamma must be >= 1, got {gamma!r}")
    if c is not None and np.any(np.asarray(c, dtype=float) < 0):
        raise ValueError(f"c must be >= 0, got {c!r}")


def expected_tokens(alpha, gamma):
    """Expected tokens per round, (1 − α^(γ+1)) / (1 − α); γ + 1 at α = 1. Works on arrays."""
    _check(alpha, gamma)
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a < 1, (1 - a ** (g + 1)) / (1 - np.where(a < 1, a, 0.5)), g + 1)
    return out.item() if out.ndim == 0 else out


def improvement(alpha, gamma, c):
    """Predicted speedup over plain decoding: E[tokens] / (γc + 1)."""
    _check(alpha, gamma, c)
    out = np.asarray(expected_tokens(alpha, gamma)) / (np.asarray(gamma, dtype=float) * np.asarray(c, dtype=float) + 1)
    return out.item() if out.ndim == 0 else out


def best_gamma(alpha: float, c: float, max_gamma: int = 16) -> tuple[int, float]:
    """The γ in 1 … ``max_gamma`` with the largest predicted improvement, and that improvement."""
    gammas = np.arange(1, max_gamma + 1)
    imp = improvement(np.full(gammas.shape, alpha), gammas, c)
    i = int(np.argmax(imp))
    return int(gammas[i]), float(imp[i])


def break_even_alpha(c: float, gamma: int) -> float:
    """The α at which speculation with γ drafts and cost ratio c neither gains nor loses (improvement = 1);
    1.0 if no α < 1 reaches it (the draft is too expensive: γc ≥ γ)."""
    _check(0.5, gamma, c)
    f = lambda a: improvement(a, gamma, c) - 1.0  # noqa: E731
    if f(1.0 - 1e-12) <= 0:
        return 1.0
    if f(0.0) >= 0:  # c = 0: free drafts never lose
        return 0.0
    return float(brentq(f, 0.0, 1.0 - 1e-12))


def alpha_mle(accepted: int, rejections: int) -> float:
    """α from the rounds: accepted drafts / (accepted drafts + rounds that ended in a rejection)."""
    if accepted < 0 or rejections < 0:
        raise ValueError("counts must be non-negative")
    trials = accepted + rejections
    return float("nan") if trials == 0 else accepted / trials
