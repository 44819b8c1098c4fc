"""Synthetic run folders for the reporting paths' tests: a legacy run's raw tables copied into repeats r0..r<n-1> of
one fingerprint under a scratch results root, with ``edit`` changing raw numbers before they are written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from servelab.paths import DATA_DIR

LEGACY = DATA_DIR / "results" / "nvidia-h200"


def write_runs(root: Path, study: str, raw: list[str], repeats: int = 3, edit: Callable | None = None) -> Path:
    """``raw`` tables of ``study``'s legacy run as ``repeats`` complete runs at fingerprint ``feedc0de``; ``edit(name,
    df)`` may return a changed table. The results root."""
    src = LEGACY / study / "runs" / "legacy" / "all" / "r0"
    meta = json.loads((src / "run.json").read_text())
    for k in range(repeats):
        d = root / "nvidia-h200" / study / "runs" / "feedc0de" / "all" / f"r{k}"
        d.mkdir(parents=True)
        for name in raw:
            df = pd.read_csv(src / f"{name}.csv")
            if edit is not None:
                df = edit(name, df)
            df.to_csv(d / f"{name}.csv", index=False)
        m = dict(meta, fingerprint="feedc0de", repeat_index=k, seed=k, files=[f"{n}.csv" for n in raw], complete=True)
        m.pop("legacy", None)
        (d / "run.json").write_text(json.dumps(m))
    return root


def drop(root: Path, study: str, name: str) -> None:
    """Delete ``name``.csv from every run of ``study`` under ``root``."""
    for p in (root / "nvidia-h200" / study).glob(f"runs/*/*/r*/{name}.csv"):
        p.unlink()


__all__ = ["write_runs", "drop", "shutil"]
