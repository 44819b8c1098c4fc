"""How far HF eager's batch-1 decode moves between repeats, set beside how far it moves with context.

F2.2's note gives each mode's variation across contexts from each step's median over the repeats. In HF eager mode
Python launches every kernel, so a step's time follows the host: the repeats of one step differ more than a
context's worth of KV bytes would move it, and a variation across contexts read from those medians is that noise,
not a trend. This sentence puts the two side by side from each repeat's own steps.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.tested_on import model_name


def _decode_b1(steps: pd.DataFrame, mode: str) -> pd.DataFrame:
    ok = steps[steps["status"] == "ok"] if "status" in steps else steps
    return ok[(ok["phase"] == "decode") & (ok["batch"] == 1) & (ok["mode"] == mode)]


def spread_sentence(steps: pd.DataFrame, mode: str = "hf_eager") -> str:
    """From every repeat's steps (a ``repeat`` column): the largest spread of one (model, context) over the repeats,
    the largest variation across contexts within one repeat, and the longest context's time over the shortest's per
    repeat and model; "" with fewer than two repeats."""
    if not {"phase", "batch", "mode", "context", "median_ms", "repeat"} <= set(steps.columns):
        return ""  # a repeat that timed no step
    d = _decode_b1(steps, mode)
    if d.empty or d["repeat"].nunique() < 2:
        return ""
    at = d.groupby(["model", "context"])["median_ms"].agg(["min", "max"])
    between = at["max"] / at["min"] - 1
    (model, context), worst = between.idxmax(), at.loc[between.idxmax()]
    per_run = d.groupby(["model", "repeat"])
    within = (per_run["median_ms"].max() / per_run["median_ms"].min() - 1).max()
    ends = per_run.apply(
        lambda g: g.loc[g["context"].idxmax(), "median_ms"] / g.loc[g["context"].idxmin(), "median_ms"]
    )
    said = (
        f"In {mode} mode, batch-1 decode at one context differs by up to {100 * between.max():.0f}% over its "
        f"{d['repeat'].nunique()} repeats ({model_name(model)} at {context:,} tokens, {worst['min']:.1f}–"
        f"{worst['max']:.1f} ms), and within one repeat across contexts by up to {100 * within:.0f}%; the longest "
        f"context's time is {ends.min():.2f}–{ends.max():.2f}× the shortest's per repeat and model"
    )
    if ends.min() < 1 < ends.max():  # no steady rise: the spread is the host's, which launches every kernel
        said += ", with no steady rise: the variation is the host's noise, not an effect of context"
    return said
