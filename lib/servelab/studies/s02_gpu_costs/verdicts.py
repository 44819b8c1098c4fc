"""Verdicts on the seed's Study 2 claims (F2.1–F2.3), computed from the sweep data by stated rules.

The RTX 2070 values below are the seed's, quoted from ``shared/seed-studies.md``; everything else is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from servelab.studies.common.findings import Finding
from servelab.studies.common.tested_on import tested_on

SEED_PREFILL_US_PER_TOKEN = (30.0, 70.0)  # F2.1, RTX 2070
SEED_DECODE_US_PER_TOKEN = (5300.0, 10800.0)  # F2.2, RTX 2070, single request
LONG_PROMPT = 4096  # "long sequences": prompts of at least this many tokens
LAUNCH_BOUND_PCT = 20.0  # below this % of the roofline floor a step is not bandwidth-bound
HOLD_RATIO = (0.5, 2.0)  # F2.3: the seed's default costs hold where its prefill cost is within this factor of ours
FLAT_PCT = 10.0  # "constant with prefix length": max/min - 1 within this


def long_prompt(prefill: pd.DataFrame) -> int:
    """Prompts count as long from LONG_PROMPT tokens, or from the longest measured if shorter (smoke)."""
    return min(LONG_PROMPT, int(prefill["new_tokens"].max())) if len(prefill) else LONG_PROMPT


CLAIMS = {  # id: (the seed's claim, the seed's value, the unit)
    "F2.1": ("prefill converges to 30–70 µs/token at long sequences", "30–70", "µs/token"),
    "F2.2": (
        "decode is memory-bandwidth-bound: constant with prefix length, 5,300–10,800 µs/token for a single request",
        "5,300–10,800",
        "µs/token",
    ),
    "F2.3": (
        "the simulator's default costs hold for server-level amortized batching",
        "30–70 (prefill)",
        "µs/token (prefill / decode)",
    ),
}


def _ok(df):
    return df[df["status"] == "ok"]


def _finding(fid: str, **fields) -> Finding:
    """One claim's finding, its words, seed value and unit from ``CLAIMS``; ``fields``: the rest by name (``headline``
    is the number its verdict is decided on, none where nothing ran)."""
    claim, seed, unit = CLAIMS[fid]
    return Finding(id=fid, claim=claim, seed_value=seed, unit=unit, **fields)


def _long_prompts(steps: pd.DataFrame) -> pd.DataFrame:
    """Batch-1 prefill from position 0 at long prompts (``long_prompt``), in every mode: the engine modes also time
    chunks after cached context, which are not the prompts F2.1 reads."""
    d = _ok(steps)
    d = d[(d["phase"] == "prefill") & (d["batch"] == 1)]
    if "context" in d:
        d = d[d["context"] == 0]
    return d[d["new_tokens"] >= long_prompt(d)]


def f21_prefill(steps: pd.DataFrame, dtype: str | None = None) -> Finding:
    """F2.1: prefill µs/token at long prompts (batch 1), across models and modes as its rule reads, against the
    seed's 30–70: the range of every (model, mode) median, each mode's range beside it, HF eager (the seed's mode)
    first. (Until 2026-12-06 the code read HF eager alone, against its registered text; the verdict is the same on
    either: every mode is far below the seed's band.)"""
    d = _long_prompts(steps)
    if d.empty:
        return _finding(
            "F2.1", verdict="changes", measured_value="not measured", note="no long-prompt prefill points ran"
        )
    tokens = long_prompt(d)
    per = d.groupby(["mode", "model"], sort=False)[["us_per_token", "pct_of_floor"]].median()
    ran = list(per.index.unique("mode"))  # in the order they ran, HF eager (the seed's mode) first
    modes = sorted(ran, key=lambda m: (m != "hf_eager", ran.index(m)))
    by_mode = per.groupby(level="mode", sort=False).agg(["min", "max"]).loc[modes]
    lo, hi = per["us_per_token"].min(), per["us_per_token"].max()
    overlap = hi >= SEED_PREFILL_US_PER_TOKEN[0] and lo <= SEED_PREFILL_US_PER_TOKEN[1]
    each = ", ".join(
        f"{m} {x[('us_per_token', 'min')]:.1f}–{x[('us_per_token', 'max')]:.1f}" for m, x in by_mode.iterrows()
    )
    floors = "; ".join(
        f"{m} {x[('pct_of_floor', 'min')]:.0f}–{x[('pct_of_floor', 'max')]:.0f}%" for m, x in by_mode.iterrows()
    )
    models = per.index.unique("model")
    where = f"{lo:.1f}–{hi:.1f} µs/token at ≥ {tokens:,} tokens over {len(models)} models and {len(modes)} modes"
    note = (
        f"{where}, within the seed's band"
        if overlap
        else f"{where}, {SEED_PREFILL_US_PER_TOKEN[0] / hi:.0f}–{SEED_PREFILL_US_PER_TOKEN[1] / lo:.0f}× below "
        "the RTX 2070's band: prefill is compute-bound and the H200's matmul rate is far higher"
    ) + f". Per mode: {each} µs/token, at {floors} of the compute floor"
    return _finding(
        "F2.1",
        verdict="holds" if overlap else "changes",
        measured_value=f"{lo:.1f}–{hi:.1f} µs/token over {len(modes)} modes ({each})",
        note=note,
        headline=float(per["us_per_token"].median()),
        headline_unit=f"µs/token, prefill at ≥ {tokens:,} tokens, median over {len(per)} model-mode pairs",
        tested_on=tested_on(
            d["model"], dtype=dtype, setting=f"{', '.join(modes)}; batch 1, prompts ≥ {tokens:,} tokens"
        ),
    )


@dataclass(frozen=True)
class DecodeReading:
    """Batch-1 decode of one set of steps, as F2.2 reads it: the seed's mode (``mode``) and the fastest mode measured,
    each with its largest variation across contexts (%) and its lowest and highest share of the memory floor (%)."""

    mode: str
    fastest_mode: str
    us_min: float  # ``mode``'s time per token, fastest and slowest step
    us_max: float
    var: float
    lo: float
    hi: float
    fvar: float
    flo: float
    fhi: float
    models: tuple[str, ...]
    modes: tuple[str, ...]
    contexts: tuple[int, int]


def read_decode(steps: pd.DataFrame, mode: str = "hf_eager") -> DecodeReading | None:
    """F2.2's numbers from ``steps`` (one repeat's, or each step's median over repeats); None where no batch-1
    decode of ``mode`` ran."""
    d = _ok(steps)
    d = d[(d["phase"] == "decode") & (d["batch"] == 1)]
    if d.empty or not (d["mode"] == mode).any():
        return None

    def describe(g):
        by_model = g.groupby("model")
        variation = (by_model["median_ms"].max() / by_model["median_ms"].min() - 1) * 100
        return variation.max(), g["pct_of_floor"].min(), g["pct_of_floor"].max()

    seedlike = d[d["mode"] == mode]
    fastest_mode = d.groupby("mode")["median_ms"].median().idxmin()
    us = seedlike["us_per_token"]
    return DecodeReading(
        mode,
        fastest_mode,
        us.min(),
        us.max(),
        *describe(seedlike),
        *describe(d[d["mode"] == fastest_mode]),
        models=tuple(d["model"]),
        modes=tuple(d["mode"].unique()),
        contexts=(int(seedlike["context"].min()), int(seedlike["context"].max())),
    )


def decode_words(x: DecodeReading) -> tuple[str, str]:
    """F2.2's value and note: the seed's mode's time per token beside the fastest mode's share of the floor, which
    the rule reads, and both modes' shares of the floor and variation across contexts."""
    value = (
        f"{x.us_min:,.0f}–{x.us_max:,.0f} µs/token in {x.mode} (the seed's mode); {x.fastest_mode} mode: "
        f"{x.flo:.1f}–{x.fhi:.1f}% of the memory floor"
    )
    note = f"{x.mode}: {x.lo:.1f}–{x.hi:.1f}% of the memory floor, varying {x.var:.0f}% across contexts"
    if x.fastest_mode != x.mode:
        note += f"; {x.fastest_mode}: {x.flo:.1f}–{x.fhi:.1f}% of the floor, varying {x.fvar:.0f}% across contexts"
    note += (
        "; decode here is bound by kernel launches and framework overhead, not by HBM bandwidth"
        if x.flo < LAUNCH_BOUND_PCT
        else "; bandwidth-bound, as the seed said"
    )
    return value, note


def f22_decode(steps: pd.DataFrame, mode: str = "hf_eager", dtype: str | None = None) -> Finding:
    """F2.2: single-request decode: constant with context? bandwidth-bound? µs/token against the seed's.

    The value compared with the seed is ``mode``'s (HF eager, as the seed ran it). Whether decode is
    bandwidth-bound is judged on the fastest mode measured: if even that runs far above the memory floor,
    the step is bound by launches and framework overhead, not by HBM.
    """
    x = read_decode(steps, mode)
    if x is None:
        return _finding("F2.2", verdict="fails", measured_value="not measured", note="no batch-1 decode points ran")
    flat = x.fvar <= FLAT_PCT
    bandwidth_bound = x.flo >= LAUNCH_BOUND_PCT
    in_band = x.us_max >= SEED_DECODE_US_PER_TOKEN[0] and x.us_min <= SEED_DECODE_US_PER_TOKEN[1]
    verdict = "fails" if not bandwidth_bound else ("holds" if flat and in_band else "changes")
    value, note = decode_words(x)
    return _finding(
        "F2.2",
        verdict=verdict,
        measured_value=value,
        note=note,
        headline=float(x.flo),
        # the rule's number is the fastest mode's, not the seed's mode's beside it in the value: the unit says whose
        headline_unit=(
            f"% of the memory floor, lowest in {x.fastest_mode} mode, the fastest "
            f"(bandwidth-bound from {LAUNCH_BOUND_PCT:g}%)"
        ),
        tested_on=tested_on(
            x.models,
            dtype=dtype,
            setting=f"batch 1, contexts {x.contexts[0]:,}–{x.contexts[1]:,} tokens; modes {', '.join(x.modes)}",
        ),
    )


def f23_sim_defaults(
    steps: pd.DataFrame,
    amortized_batch: int = 64,
    context: int = 512,
    mode: str | None = None,
    dtype: str | None = None,
) -> Finding:
    """F2.3: do the RTX 2070's costs (the simulator's defaults) carry to the H200 at server-level batching?

    Compares the amortized per-token costs measured here (prefill at long prompts, decode at
    ``amortized_batch`` sequences) with the seed's prefill band; a ratio within 2× would make them transferable.
    """
    d = _ok(steps)
    if mode is None:  # the fastest HF mode that ran: CUDA graphs on a GPU
        mode = "hf_cuda_graph" if (d["mode"] == "hf_cuda_graph").any() else "hf_eager"
    pre = d[d["phase"] == "prefill"]
    pre = pre[pre["new_tokens"] >= long_prompt(pre)]["us_per_token"]
    batches = d.loc[(d["phase"] == "decode") & (d["mode"] == mode), "batch"]
    if len(batches) and amortized_batch not in set(batches):  # the largest batch measured up to the one asked for
        amortized_batch = int(
            batches[batches <= amortized_batch].max() if (batches <= amortized_batch).any() else batches.min()
        )
    dec = d[(d["phase"] == "decode") & (d["mode"] == mode) & (d["batch"] == amortized_batch)]
    if len(dec) and context not in set(dec["context"]):
        context = int(dec["context"].min())
    dec = dec[dec["context"] == context]["us_per_token"]  # keeps ``d``'s index: the models are looked up below
    if pre.empty or dec.empty:
        return _finding(
            "F2.3",
            verdict="changes",
            measured_value="not measured",
            note=f"needs long prefills and {mode} decode at batch {amortized_batch}",
        )
    seed_mid = sum(SEED_PREFILL_US_PER_TOKEN) / 2
    ratio = seed_mid / pre.median()
    holds = HOLD_RATIO[0] <= ratio <= HOLD_RATIO[1]
    note = (
        f"amortized on the H200: prefill {pre.median():.1f} µs/token, decode {dec.median():.1f} µs/token at batch "
        f"{amortized_batch} and context {context} ({mode}); the RTX 2070's prefill cost is {ratio:.0f}× the H200's, "
        "so defaults must be re-fitted per GPU (the cost model below); the simulator page measures the simulator's "
        "fidelity against the real server"
    )
    models = d.loc[pre.index.union(dec.index), "model"]
    return _finding(
        "F2.3",
        verdict="holds" if holds else "changes",
        measured_value=f"{pre.median():.1f} / {dec.median():.1f}",
        note=note,
        headline=float(ratio),
        # "6.4 × the RTX 2070's prefill speed": the H200's speed as a multiple of it, the rule after the unit
        headline_unit=(
            f"× the RTX 2070's prefill speed (the H200's, from the middle of the seed's "
            f"{SEED_PREFILL_US_PER_TOKEN[0]:g}–{SEED_PREFILL_US_PER_TOKEN[1]:g} µs/token over the H200's µs/token; "
            f"holds within {HOLD_RATIO[0]:g}–{HOLD_RATIO[1]:g}×)"
        ),
        tested_on=tested_on(
            models,
            dtype=dtype,
            setting=f"prefill ≥ {long_prompt(d[d['phase'] == 'prefill']):,} tokens; {mode} decode at batch "
            f"{amortized_batch}, context {context}",
        ),
    )


def findings(steps: pd.DataFrame, dtype: str | None = None) -> list[Finding]:
    """F2.1–F2.3 from the sweep's steps; ``dtype`` (the run's weights and KV dtype) is named in ``tested_on``."""
    return [f21_prefill(steps, dtype=dtype), f22_decode(steps, dtype=dtype), f23_sim_defaults(steps, dtype=dtype)]
