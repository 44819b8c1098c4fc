"""Study 5's derived columns, computed at report time from a run's raw rows and that run's measured ceilings."""

from __future__ import annotations

import pandas as pd

from servelab.measure.roofline import Roofline


def add_roofline(df: pd.DataFrame, roof: Roofline) -> pd.DataFrame:
    """Roofline columns against the measured ceilings: floor time (ms), which term sets it, % of the floor
    reached, achieved TFLOP/s, and achieved GB/s counting the K and V bytes (decode's floor)."""
    out = df.copy()
    if "median_ms" not in out:
        out["median_ms"] = float("nan")
    ok = out["status"].eq("ok")
    t = out["median_ms"].where(ok)
    out["floor_ms"] = roof.floor_ms(out["flops"], out["min_bytes"])
    out["bound"] = roof.bound(out["flops"], out["min_bytes"])
    out["pct_of_floor"] = roof.pct_of_floor(t, out["flops"], out["min_bytes"])
    out["achieved_tflop_s"] = roof.achieved_tflop_s(t, out["flops"])
    out["achieved_gb_s"] = roof.achieved_gb_s(t, out["kv_bytes"])
    return out
