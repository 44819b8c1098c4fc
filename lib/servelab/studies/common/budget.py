"""A study's wall-time budget: one clock from the notebook's first code cell, that sweeps check before each point.

A study must finish within a fixed wall time on the H200. What runs first takes what it takes (a model load, the
trained family when it is not cached); each sweep then gets what is left (less a reserve for the work after it) and
skips, visibly (``SKIPPED`` in its status column), whatever does not fit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

SKIPPED = "skipped: time budget"


@dataclass
class Budget:
    """``total_s`` seconds of wall time from construction (``time.monotonic``); 0 is a budget already spent."""

    total_s: float
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if isinstance(self.total_s, bool) or not isinstance(self.total_s, (int, float)) or not self.total_s >= 0:
            raise ValueError(f"total_s must be a non-negative number of seconds, got {self.total_s!r}")
        self.total_s = float(self.total_s)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def left_s(self) -> float:
        """Seconds left (negative once the budget is spent)."""
        return self.total_s - self.elapsed_s()

    def spent(self, need_s: float = 0.0) -> bool:
        """Whether less than ``need_s`` seconds are left (nothing left, by default)."""
        return self.left_s() <= need_s

    def sweep_budget_s(self, reserve_s: float, cap_s: float | None = None) -> float:
        """What a sweep starting now may spend: the time left less ``reserve_s`` (kept for the work after it),
        at most ``cap_s`` when given, never below 0."""
        left = self.left_s() - reserve_s
        return max(0.0, min(left, cap_s if cap_s is not None else math.inf))
