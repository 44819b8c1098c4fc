"""One part of Study 3 run on its own (``python -m`` a part's module), outside the notebook.

The part's raw repeats and provenance go to a folder of their own (``03_speculative_<part>/``); its table goes beside
the study's other results (``03_speculative/<name>.csv``), where the notebook and the book read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import torch


def run_part(
    folder: str,
    raw_name: str,
    name: str,
    params: dict,
    measure: Callable[[str], pd.DataFrame],
    tabulate: Callable[[pd.DataFrame], pd.DataFrame],
) -> tuple[pd.DataFrame, float]:
    """``measure(device)`` -> raw rows, written as ``<folder>/<raw_name>.csv`` with ``params`` in its run.json;
    ``tabulate(raw)`` written as ``03_speculative/<name>.csv``. Returns the table and the wall time (s)."""
    from servelab.measure import device_record
    from servelab.measure.results import StudyResults

    dev = device_record()
    if dev.kind != "cuda":
        torch.set_num_threads(1)  # small models on a small CPU: intra-op threads only contend
    res = StudyResults(folder, dev, params)
    t0 = time.perf_counter()
    raw = measure("cuda" if dev.kind == "cuda" else "cpu")
    res.write(raw_name, raw)
    table = tabulate(raw)
    (res.dir.parent / "03_speculative").mkdir(exist_ok=True)
    res.write_for("03_speculative", name, table)
    wall_s = time.perf_counter() - t0
    res.finish(wall_s=wall_s)
    print(table.round(3).to_string(index=False))
    return table, wall_s
