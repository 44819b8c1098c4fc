"""A verdict decided within one noise width of its threshold: the studies' test of it (``near_threshold``, and
``thresholds_near`` over a rule's thresholds), so that such a verdict says so in its note.

Its own module, apart from the rule registry (``common.rules``): the studies' verdicts read it, and the registry's
old rules read the studies' reports, which read their verdicts.
"""

from __future__ import annotations

import math

from servelab.errors import ParameterError


def near_threshold(value: float, threshold: float, noise: float) -> bool:
    """True when ``value`` lies within one noise width of ``threshold`` (|value − threshold| ≤ noise): a verdict
    decided there must say so. ``noise`` is in the value's unit (a CI half-width, the repeats' spread)."""
    for name, x in (("value", value), ("threshold", threshold), ("noise", noise)):
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise ParameterError(f"near_threshold: {name} must be a finite number, got {x!r}")
    if noise < 0:
        raise ParameterError(f"near_threshold: noise must be ≥ 0, got {noise!r}")
    return abs(value - threshold) <= noise


def thresholds_near(value: float, thresholds, noise: float) -> list[float]:
    """The thresholds of a rule that ``value`` lies within one ``noise`` width of (``near_threshold``), in the
    order given; none where the value or the noise is not a finite number (nothing measured, no noise estimate)."""
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in (value, noise)):
        return []
    return [t for t in thresholds if near_threshold(float(value), float(t), float(noise))]
