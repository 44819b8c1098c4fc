"""Silence, at the call, library warnings that say nothing about the measurement, so a study page shows none.

- torch.profiler warns once per process that it "clears events at the end of each cycle": true of its scheduled
  cycles, which no study uses (each profile is one ``with profile(...)`` block read in full).
- ``tqdm.auto``, imported by the Hugging Face libraries when a model loads, warns in a notebook kernel without
  ipywidgets that it falls back to text bars ("IProgress not found"); the studies show no progress bar at all.

Only these messages are filtered, and only inside the block; every other warning still shows.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

PROFILER_CYCLE_WARNING = r".*Profiler clears events at the end of each cycle"
TQDM_WIDGETS_WARNING = r"IProgress not found"


@contextmanager
def quiet_profiler() -> Iterator[None]:
    """Run the block with torch.profiler's per-cycle warning filtered."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING, category=UserWarning)
        yield


@contextmanager
def quiet_run() -> Iterator[None]:
    """Run a whole study with both warnings above filtered (the profiler's, and tqdm.auto's fallback notice)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING, category=UserWarning)
        warnings.filterwarnings("ignore", message=TQDM_WIDGETS_WARNING)
        # tqdm.auto warns once, when first imported; the imports that reach it (transformers') add warning filters of
        # their own ahead of ours on the way, so it is imported here first, while ours is the one that applies
        importlib.import_module("tqdm.auto")
        yield
