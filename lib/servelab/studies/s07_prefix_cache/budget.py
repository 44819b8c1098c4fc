"""The study's wall-time budget: sweeps skip their remaining points once it is spent."""

from __future__ import annotations

import time

SKIPPED = "skipped: time budget"


class Budget:
    """``seconds`` of wall time from now (``time.perf_counter``); ``left_s()``, ``spent(need_s=0)``."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.start = time.perf_counter()

    def left_s(self) -> float:
        return self.start + self.seconds - time.perf_counter()

    def spent(self, need_s: float = 0.0) -> bool:
        """Whether less than ``need_s`` seconds are left (nothing left, by default)."""
        return self.left_s() <= need_s

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start
