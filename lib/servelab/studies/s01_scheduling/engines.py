"""How Study 1's servers ran their engines, from what each server recorded when it started (``servers.csv``).

Each model's servers of every repeat, with the settings that decide a step's cost: the attention backend, CUDA
graphs, whole-step graphs and ``torch.compile``. The engine keeps ``torch.compile`` only where its check passes
(``engine.compilation.compile_with_check``: the whole model's compiled logits within 5% of the eager ones' largest),
and a refusal changes every step time the study reports, so the page says where it happened, with the check's own
numbers.
"""

from __future__ import annotations

import re

import pandas as pd

from servelab.studies.common.tested_on import model_name

REFUSED = re.compile(r"differ from eager by ([0-9.]+) \(scale ([0-9.]+)\)")


def engine_view(servers: pd.DataFrame) -> pd.DataFrame:
    """One row per model: its servers over the repeats, and each setting as they recorded it (distinct values
    joined; compile as "on" or "off" with how many servers)."""
    if servers.empty:
        return pd.DataFrame()
    rows = []
    for model, g in servers.groupby("model", sort=False):
        compiled = g["compile"].astype(str).str.startswith("on")
        rows.append(
            {
                "model": model_name(model),
                "servers": len(g),
                "repeats": g["repeat"].nunique(),
                "attention": ", ".join(dict.fromkeys(g["attention_backend"].astype(str))),
                "decode graphs captured": ", ".join(dict.fromkeys(g["cuda_graphs"].astype(str))),
                "whole-step graphs": ", ".join(dict.fromkeys(g["step_graphs"].astype(str))),
                "torch.compile": _count(compiled),
            }
        )
    return pd.DataFrame(rows)


def _count(on: pd.Series) -> str:
    if on.all():
        return f"on ({len(on)} of {len(on)})"
    if not on.any():
        return f"off ({len(on)} of {len(on)})"
    return f"on in {int(on.sum())} of {len(on)}"


def compile_lines(servers: pd.DataFrame) -> str:
    """A sentence per model whose servers ran without ``torch.compile``, with the check's refusals."""
    if servers.empty:
        return ""
    out = []
    for model, g in servers.groupby("model", sort=False):
        off = g[~g["compile"].astype(str).str.startswith("on")]
        if off.empty:
            continue
        found = off["compile"].astype(str).str.extract(REFUSED).astype(float).dropna()
        why = ""
        if not found.empty:
            ratio = found[0] / found[1]
            why = (
                f": the engine's check found the compiled logits {_span(found[0], '.3g')} away from the eager ones, "
                f"whose largest was {_span(found[1], '.3g')} ({_span(100 * ratio, '.1f')}% of it, over the 5% "
                f"its rule allows)"
            )
        out.append(
            f"**{model_name(model)} ran without `torch.compile`** in {len(off)} of its {len(g)} servers "
            f"({off['repeat'].nunique()} of {g['repeat'].nunique()} repeats){why}. Its step times, and every latency "
            "built on them, are the uncompiled engine's; the other settings are as the table says. Issue 29 "
            "replaces the whole-model check, whose margin a deep model's bf16 rounding can pass, with one on the "
            "compiled code's first blocks."
        )
    return "\n\n".join(out)


def _span(x: pd.Series, fmt: str) -> str:
    lo, hi = x.min(), x.max()
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def engine_section(runs) -> tuple:
    """What the page shows under "How the engine ran": the table and the compile sentences, or "Not measured."."""
    servers = runs.table("servers") if runs.measured else pd.DataFrame()
    if servers.empty:
        return ("Not measured.",)
    return engine_view(servers), compile_lines(servers)
