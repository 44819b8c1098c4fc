"""A development benchmark's rows (``scripts/bench_*.py``): a path that fails is a row that says why, so the other
paths still run, and each row is printed as it lands, so a run cut off by its time limit still shows what it got."""

from __future__ import annotations


def error_fields(e: BaseException) -> dict:
    """The fields that mark a row as failed: its status and the error, cut to a CSV cell's length."""
    return dict(status="error", note=f"{type(e).__name__}: {e}"[:300])


def show(row: dict) -> None:
    """Print ``row`` with its floats at 4 significant digits, flushed (the device tool keeps the output's tail)."""
    print({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}, flush=True)
