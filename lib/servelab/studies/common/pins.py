"""Which of a study's older run folders pruning may take out of the tree: the rule ``prune`` applies and
``tree_growth`` forecasts with (a module of its own, so the plan, which forecasts, and pruning, which reads the
plan, do not import each other).

Never taken: ``runs/legacy/`` (the first H200 runs, which reporting paths read by name) and any folder that a file
under ``data/validation`` names (the simulator's freeze hashes the runs it was calibrated on).
"""

from __future__ import annotations

from pathlib import Path

from servelab.paths import DATA_DIR

LEGACY = "legacy"


def kept_out(folders, study: str, pins: Path | None = None) -> list[Path]:
    """Of ``study``'s fingerprint ``folders``, those pruning may take: not ``legacy``, and named by no file under
    ``pins`` (default ``data/validation``)."""
    pins = DATA_DIR / "validation" if pins is None else Path(pins)
    pinned = "\n".join(p.read_text(errors="replace") for p in sorted(pins.rglob("*")) if p.is_file())
    return [f for f in sorted(folders) if f.name != LEGACY and f"/{study}/runs/{f.name}/" not in pinned]
