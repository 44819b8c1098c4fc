"""The roofline model: a floor time from FLOPs and bytes, and how far a measurement is above it.

    t_floor = max(FLOPs / P_peak, bytes / B_peak)

with P_peak and B_peak the *measured* ceilings (``Ceilings``), never spec-sheet numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.measure.ceilings import Ceilings


@dataclass(frozen=True)
class Roofline:
    matmul_tflop_s: float
    copy_gb_s: float

    @classmethod
    def from_ceilings(cls, c: Ceilings) -> Roofline:
        return cls(matmul_tflop_s=c.matmul_tflop_s, copy_gb_s=c.copy_gb_s)

    def compute_ms(self, flops):
        return np.asarray(flops, dtype=float) / (self.matmul_tflop_s * 1e12) * 1e3

    def memory_ms(self, nbytes):
        return np.asarray(nbytes, dtype=float) / (self.copy_gb_s * 1e9) * 1e3

    def floor_ms(self, flops, nbytes):
        """Roofline floor time in ms: the larger of the compute and memory times."""
        return np.maximum(self.compute_ms(flops), self.memory_ms(nbytes))

    def bound(self, flops, nbytes):
        """'compute' or 'memory': which term sets the floor."""
        return np.where(self.compute_ms(flops) >= self.memory_ms(nbytes), "compute", "memory")

    def pct_of_floor(self, measured_ms, flops, nbytes):
        """Floor time as a percentage of measured time: 100% means running at the roofline."""
        return 100.0 * self.floor_ms(flops, nbytes) / np.asarray(measured_ms, dtype=float)

    def achieved_tflop_s(self, measured_ms, flops):
        return np.asarray(flops, dtype=float) / (np.asarray(measured_ms, dtype=float) * 1e-3) / 1e12

    def achieved_gb_s(self, measured_ms, nbytes):
        return np.asarray(nbytes, dtype=float) / (np.asarray(measured_ms, dtype=float) * 1e-3) / 1e9
