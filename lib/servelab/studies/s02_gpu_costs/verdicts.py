"""Verdicts on the seed's Study 2 claims (F2.1–F2.3), computed from the sweep data by stated rules.

The RTX 2070 values below are the seed's, quoted from ``shared/seed-studies.md``; everything else is measured.
"""

from __future__ import annotations

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


def _finding(
    fid: str,
    *,
    measured_value: str,
    verdict: str,
    note: str,
    tested_on: str = "",
    headline: float | None = None,
    headline_unit: str = "",
) -> Finding:
    """One claim's finding; ``headline`` is the number its verdict is decided on (none where nothing ran)."""
    claim, seed, unit = CLAIMS[fid]
    return Finding(
        id=fid,
        claim=claim,
        seed_value=seed,
        measured_value=measured_value,
        unit=unit,
        verdict=verdict,
        note=note,
        tested_on=tested_on,
        headline=headline,
        headline_unit=headline_unit,
    )


def f21_prefill(steps: pd.DataFrame, mode: str = "hf_eager", dtype: str | None = None) -> Finding:
    """F2.1: prefill µs/token at long prompts (batch 1), across models, against the seed's 30–70."""
    d = _ok(steps)
    d = d[(d["phase"] == "prefill") & (d["mode"] == mode) & (d["batch"] == 1)]
    d = d[d["new_tokens"] >= long_prompt(d)]
    if d.empty:
        return _finding(
            "F2.1", verdict="changes", measured_value="not measured", note="no long-prompt prefill points ran"
        )
    per_model = d.groupby("model")["us_per_token"].median()
    lo, hi = per_model.min(), per_model.max()
    overlap = hi >= SEED_PREFILL_US_PER_TOKEN[0] and lo <= SEED_PREFILL_US_PER_TOKEN[1]
    pct = d.groupby("model")["pct_of_floor"].median()
    note = (
        f"at ≥{long_prompt(d)} tokens prefill runs at {pct.min():.0f}–{pct.max():.0f}% of the compute floor "
        f"({', '.join(f'{m}: {v:.1f} µs/token' for m, v in per_model.items())}); "
        + (
            "within the seed's band"
            if overlap
            else f"{SEED_PREFILL_US_PER_TOKEN[0] / hi:.0f}–{SEED_PREFILL_US_PER_TOKEN[1] / lo:.0f}× below the RTX "
            "2070's band: prefill is compute-bound and the H200's matmul rate is far higher"
        )
    )
    return _finding(
        "F2.1",
        verdict="holds" if overlap else "changes",
        measured_value=f"{lo:.1f}–{hi:.1f}",
        note=note,
        headline=float(per_model.median()),
        headline_unit=f"µs/token, prefill at ≥ {long_prompt(d)} tokens, median over {len(per_model)} models",
        tested_on=tested_on(d["model"], dtype=dtype, setting=f"{mode}, batch 1, prompts ≥ {long_prompt(d)} tokens"),
    )


def f22_decode(steps: pd.DataFrame, mode: str = "hf_eager", dtype: str | None = None) -> Finding:
    """F2.2: single-request decode: constant with context? bandwidth-bound? µs/token against the seed's.

    The value compared with the seed is ``mode``'s (HF eager, as the seed ran it). Whether decode is
    bandwidth-bound is judged on the fastest mode measured: if even that runs far above the memory floor,
    the step is bound by launches and framework overhead, not by HBM.
    """
    d = _ok(steps)
    d = d[(d["phase"] == "decode") & (d["batch"] == 1)]
    if d.empty or not (d["mode"] == mode).any():
        return _finding("F2.2", verdict="fails", measured_value="not measured", note="no batch-1 decode points ran")

    def describe(g):
        by_model = g.groupby("model")
        variation = (by_model["median_ms"].max() / by_model["median_ms"].min() - 1) * 100
        return variation.max(), g["pct_of_floor"].min(), g["pct_of_floor"].max()

    seedlike = d[d["mode"] == mode]
    fastest_mode = d.groupby("mode")["median_ms"].median().idxmin()
    var, lo, hi = describe(seedlike)
    fvar, flo, fhi = describe(d[d["mode"] == fastest_mode])
    us = seedlike["us_per_token"]
    flat = fvar <= FLAT_PCT
    bandwidth_bound = flo >= LAUNCH_BOUND_PCT
    in_band = us.max() >= SEED_DECODE_US_PER_TOKEN[0] and us.min() <= SEED_DECODE_US_PER_TOKEN[1]
    verdict = "fails" if not bandwidth_bound else ("holds" if flat and in_band else "changes")
    note = f"{mode}: {lo:.1f}–{hi:.1f}% of the memory floor, varying {var:.0f}% across contexts"
    if fastest_mode != mode:
        note += f"; {fastest_mode}: {flo:.1f}–{fhi:.1f}% of the floor, varying {fvar:.0f}% across contexts"
    note += (
        "; decode here is bound by kernel launches and framework overhead, not by HBM bandwidth"
        if not bandwidth_bound
        else "; bandwidth-bound, as the seed said"
    )
    contexts = f"contexts {seedlike['context'].min():,}–{seedlike['context'].max():,} tokens"
    return _finding(
        "F2.2",
        verdict=verdict,
        # the seed's mode's time per token beside the fastest mode's share of the floor, which the rule reads
        measured_value=(
            f"{us.min():,.0f}–{us.max():,.0f} µs/token in {mode} (the seed's mode); {fastest_mode}: "
            f"{flo:.1f}–{fhi:.1f}% of the memory floor"
        ),
        note=note,
        headline=float(flo),
        headline_unit=(
            f"% of the memory floor, {fastest_mode}'s slowest point (bandwidth-bound from {LAUNCH_BOUND_PCT:g}%)"
        ),
        tested_on=tested_on(
            d["model"], dtype=dtype, setting=f"batch 1, {contexts}; modes {', '.join(d['mode'].unique())}"
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
        headline_unit=(
            f"× the RTX 2070's prefill cost over the H200's (holds within {HOLD_RATIO[0]:g}–{HOLD_RATIO[1]:g}×)"
        ),
        tested_on=tested_on(
            models,
            dtype=dtype,
            setting=f"prefill ≥ {long_prompt(d[d['phase'] == 'prefill'])} tokens; {mode} decode at batch "
            f"{amortized_batch}, context {context}",
        ),
    )


def findings(steps: pd.DataFrame, dtype: str | None = None) -> list[Finding]:
    """F2.1–F2.3 from the sweep's steps; ``dtype`` (the run's weights and KV dtype) is named in ``tested_on``."""
    return [f21_prefill(steps, dtype=dtype), f22_decode(steps, dtype=dtype), f23_sim_defaults(steps, dtype=dtype)]
