"""What CUDA graphs save the engine: the same step with every kernel launched from Python, and replayed.

``engine`` replays a captured graph (decode steps: a decode graph; prefill and mixed steps: a whole-step graph);
``engine_eager`` runs the same engine, same kernels, launched one by one. Their difference per step is the
launch overhead the graphs remove; both are set against the step's roofline floor.
"""

from __future__ import annotations

import pandas as pd

from servelab.bench.step import timed_tokens

POINT = ["model", "phase", "batch", "new_tokens", "context", "decodes", "decode_context"]
GRAPH, EAGER = "engine", "engine_eager"


def step_label(row) -> str:
    """A short name for a step: ``decode 64×512``, ``prefill 4×1024``, ``chunk 512 after 2048``,
    ``mixed 16×512 + 512 after 1024`` (decodes × their context + the chunk)."""
    if row["phase"] == "decode":
        return f"decode {row['batch']}×{row['context']}"
    chunk = f"{row['batch']}×{row['new_tokens']}" if row["batch"] > 1 else f"{row['new_tokens']}"
    chunk += f" after {row['context']}" if row["context"] else ""
    if row["phase"] == "mixed":
        return f"mixed {row['decodes']}×{row['decode_context']} + {chunk}"
    return f"{'chunk' if row['context'] else 'prefill'} {chunk}"


def launch_overhead(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per step measured in both engine modes: both times (ms), the floor, and what the graph saves.

    Columns: the point's keys, ``tokens``, ``step``, ``graph_ms``, ``eager_ms``, ``floor_ms``, ``saved_ms``
    (eager − graph), ``eager_over_graph`` and each mode's % of the floor.
    """
    d = steps[(steps["status"] == "ok") & steps["mode"].isin([GRAPH, EAGER])]
    if "decodes" not in d:
        d = d.assign(decodes=0, decode_context=0)
    cols = [
        "graph_ms",
        "eager_ms",
        "floor_ms",
        "saved_ms",
        "eager_over_graph",
        "graph_pct_of_floor",
        "eager_pct_of_floor",
    ]
    if d.empty or set(d["mode"]) != {GRAPH, EAGER}:
        return pd.DataFrame(columns=POINT + ["tokens", "step"] + cols)
    wide = d.pivot_table(index=POINT, columns="mode", values=["median_ms", "floor_ms"], aggfunc="first").dropna()
    out = pd.DataFrame(
        {
            "graph_ms": wide[("median_ms", GRAPH)],
            "eager_ms": wide[("median_ms", EAGER)],
            "floor_ms": wide[("floor_ms", GRAPH)],
        }
    ).reset_index()
    out["tokens"] = timed_tokens(out["batch"], out["new_tokens"], out["decodes"])
    out["step"] = out.apply(step_label, axis=1)
    out["saved_ms"] = out["eager_ms"] - out["graph_ms"]
    out["eager_over_graph"] = out["eager_ms"] / out["graph_ms"]
    out["graph_pct_of_floor"] = 100 * out["floor_ms"] / out["graph_ms"]
    out["eager_pct_of_floor"] = 100 * out["floor_ms"] / out["eager_ms"]
    return out[POINT + ["tokens", "step"] + cols].sort_values(["model", "phase", "tokens"]).reset_index(drop=True)
