"""What the server's engine steps cost, by kind, from the step log of a Study 1 (or any server) run.

A step is *decode only* (every item one token: a CUDA-graph replay where a bucket holds the batch),
*prefill only*, or *mixed* (decodes and prefill chunks together). Both kinds with a prefill run the
model eagerly, one kernel launch at a time from Python. When those steps cost tens of times a decode
step, every policy that puts prefill chunks beside running decodes (ChunkedPrefill above all) makes
those decodes advance at the eager rate: that is a property of the engine's eager path, not of the
policy, and this table is how a reader tells the two apart.
"""

from __future__ import annotations

import pandas as pd

KINDS = ("decode only", "mixed", "prefill only")


def step_kind(prefill_tokens: int, decode_tokens: int) -> str:
    if prefill_tokens == 0:
        return "decode only"
    return "prefill only" if decode_tokens == 0 else "mixed"


def step_costs(steps: pd.DataFrame, by: tuple[str, ...] = ("model",)) -> pd.DataFrame:
    """Per group and step kind: steps, median/p90 duration (ms), median tokens, and the median duration
    relative to the group's median decode-only step (``x_decode_step``)."""
    missing = {"start_s", "end_s", "prefill_tokens", "decode_tokens", *by} - set(steps.columns)
    if missing:
        raise ValueError(f"step log lacks columns {sorted(missing)}")
    d = steps.assign(
        ms=(steps["end_s"] - steps["start_s"]) * 1e3,
        tokens=steps["prefill_tokens"] + steps["decode_tokens"],
        kind=[step_kind(p, q) for p, q in zip(steps["prefill_tokens"], steps["decode_tokens"], strict=True)],
    )
    g = d.groupby([*by, "kind"], sort=False)
    out = g.agg(
        steps=("ms", "size"),
        median_ms=("ms", "median"),
        p90_ms=("ms", lambda x: x.quantile(0.9)),
        median_tokens=("tokens", "median"),
    ).reset_index()
    decode = out[out["kind"] == "decode only"].set_index(list(by))["median_ms"]
    out["x_decode_step"] = [
        r.median_ms / decode.get(tuple(r[b] for b in by) if len(by) > 1 else r[by[0]], float("nan"))
        for _, r in out.iterrows()
    ]
    out["kind"] = pd.Categorical(out["kind"], KINDS, ordered=True)
    return out.sort_values([*by, "kind"]).reset_index(drop=True)
