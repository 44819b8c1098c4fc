"""How Study 1's servers ran their engines, from what each server recorded when it started (``servers.csv``).

Each model's servers of every repeat, with the settings that decide a step's cost: the attention backend, CUDA
graphs, whole-step graphs and ``torch.compile``. The engine keeps ``torch.compile`` only where its check passes
(``engine.compilation.compile_with_check``: compiled logits within 5% of the eager ones' largest; the whole model's
until issue 29, the first two blocks' since),
and a refusal changes every step time the study reports, so the page says where it happened, with the check's own
numbers.

The one-pass decode kernel's launch (keys per iteration, warps, pipeline stages) is chosen in each server process
by timing the candidates for a few milliseconds at startup (``kernels.triton_decode.tune_triton_decode``), so
servers of one model can run different launches; the table counts them, and a sentence says where they differ,
because a repeat's step times then carry its servers' draw as well as its seeds and traces.
"""

from __future__ import annotations

import re

import pandas as pd

from servelab.studies.common.tested_on import model_name

REFUSED = re.compile(r"differ from eager by ([0-9.]+) \(scale ([0-9.]+)\)")
LAUNCH = re.compile(r"KEYS=(\d+), warps=(\d+), stages=(\d+)")
TUNED_AT = re.compile(r"tuned at batch (\d+) x (\d+) keys")


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
                "decode kernel launch": _launches(g),
            }
        )
    return pd.DataFrame(rows)


def _launch_names(g: pd.DataFrame) -> pd.Series:
    """Each server's decode launch as "KEYS 64, 2 warps, 3 stages"; its own text where it tuned none."""
    if "triton_tuning" not in g:
        return pd.Series(dtype=str)
    text = g["triton_tuning"].dropna().astype(str)
    found = text.str.extract(LAUNCH)
    named = "KEYS " + found[0] + ", " + found[1] + " warps, " + found[2] + " stages"
    return named.fillna(text)


def _launches(g: pd.DataFrame) -> str:
    """The launches a model's servers ran, most common first, with how many servers ran each."""
    return _counted(_launch_names(g).value_counts(sort=True))


def _counted(counts: pd.Series) -> str:
    if counts.empty:
        return "not recorded"
    return counts.index[0] if len(counts) == 1 else "; ".join(f"{k} ({n})" for k, n in counts.items())


def launch_lines(servers: pd.DataFrame) -> str:
    """A sentence per model whose servers tuned the decode kernel to more than one launch, then why it varies (the
    shape the servers tuned at, as they recorded it)."""
    out = []
    for model, g in servers.groupby("model", sort=False):
        names = _launch_names(g)
        counts = names.value_counts(sort=True)
        if len(counts) < 2:
            continue
        per_repeat = g.assign(launch=names).groupby("repeat")["launch"].nunique()
        out.append(
            f"**{model_name(model)}'s servers ran {len(counts)} different decode-kernel launches** over its "
            f"{counts.sum()} servers ({_counted(counts)}), {int((per_repeat > 1).sum())} of its {len(per_repeat)} "
            "repeats with more than one."
        )
    if not out:
        return ""
    at = servers["triton_tuning"].astype(str).str.extract(TUNED_AT).dropna().drop_duplicates()
    shape = f" at one shape ({', '.join(f'batch {b} × {int(k):,} keys' for b, k in at.itertuples(index=False))})"
    return " ".join(out) + (
        f" Each server chose its launch by timing the candidates at startup{shape if len(at) else ''}, so the "
        "choice varies between repeats along with their seeds and traces, and the repeats' spread includes it. "
        "Since issue 29 the engine runs a launch measured once per device (`data/tuning/decode_launch/`) where the "
        "device has measurements, so the servers of a run measured since then agree."
    )


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
            "built on them, are the uncompiled engine's; the other settings are as the table says. Since issue 29 "
            "the check runs on the compiled code's first two blocks, where bf16 rounding cannot grow, in place of "
            "the whole model, whose margin a deep model's rounding can pass."
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
    return engine_view(servers), "\n\n".join(t for t in (compile_lines(servers), launch_lines(servers)) if t)
