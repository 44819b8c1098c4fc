"""Verdicts on the seed's Study 6 claims (F6.1, F6.2), computed from the measured tables by stated rules.

The RTX 2070 values below are the seed's, quoted from ``shared/seed-studies.md``; everything else is measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

SEED_BEST_SPEEDUP = 1.747  # F6.1, RTX 2070
SEED_BEST_PAIR = "distilgpt2 → gpt2-medium"  # F6.1, RTX 2070
SEED_LENGTH = 512  # F6.1: output tokens
HOLDS_BAND = 0.20  # F6.1 holds if the best pair's speedup is within ±20% of the seed's
DECIDES_RHO = 0.5  # F6.2: |Spearman ρ| at least this for a parameter to "decide" the speedup
MATERIAL_CHANGE = 0.05  # F6.2: and the speedup moves by at least 5% over the range of output lengths
MIN_PAIRS = 3  # F6.2: pairs needed at one output length to rank them by c

CLAIMS = {
    "F6.1": "best pair distilgpt2 → gpt2-medium: 1.747× at 512 output tokens",
    "F6.2": "cost ratio and output length are the parameters that decide the speedup",
}


def _row(fid, verdict, measured, note, seed_value, unit):
    return dict(
        id=fid, claim=CLAIMS[fid], seed_value=seed_value, measured_value=measured, unit=unit, verdict=verdict, note=note
    )


def _measured(pairs: pd.DataFrame) -> pd.DataFrame:
    return pairs.dropna(subset=["speedup_median"]) if len(pairs) else pairs


def f61_best_pair(pairs: pd.DataFrame) -> dict:
    """F6.1: the best assisted pair's median speedup at the longest output length any pair ran to, against
    1.747× (``pairs``: :func:`servelab.studies.s06_hf_assisted.analysis.pair_summary` over lengths).

    fails: no pair speeds generate up (best ≤ 1); holds: within ±20% of the seed's; changes otherwise.
    """
    d = _measured(pairs)
    seed = f"{SEED_BEST_SPEEDUP}× ({SEED_BEST_PAIR}, RTX 2070)"
    if d.empty:
        return _row("F6.1", "fails", "not measured", "no assisted run completed", seed, f"× at {SEED_LENGTH} tokens")
    length = int(d["length"].max())
    d = d[d["length"] == length]
    best = d.loc[d["speedup_median"].idxmax()]
    s = float(best["speedup_median"])
    c, a = best.get("cost_ratio", np.nan), best.get("alpha", np.nan)
    n = int(best["prompts"])
    spread = (
        f"quartiles {best['speedup_p25']:.2f}–{best['speedup_p75']:.2f} over {n} prompts" if n > 1 else "one prompt"
    )
    ran = pairs.loc[pairs["length"] == length, "pair"].nunique()
    note = (
        f"best pair {best['pair']} at {length} tokens: {s:.2f}× ({spread}), with cost ratio c = {c:.2f} and "
        f"greedy agreement α = {a:.2f}; {len(d)} of {ran} pairs ran to {length} tokens"
    )
    if length != SEED_LENGTH:
        note += f" (the RTX 2070's figure is at {SEED_LENGTH})"
    if s <= 1.0:
        verdict = "fails"
        note += "; no pair beats plain generate: assisted generation does not pay here"
    elif abs(s / SEED_BEST_SPEEDUP - 1) <= HOLDS_BAND:
        verdict = "holds"
        note += f"; within ±{HOLDS_BAND:.0%} of the RTX 2070's best"
    else:
        verdict = "changes"
        note += (
            f"; {'above' if s > SEED_BEST_SPEEDUP else 'below'} the RTX 2070's best by "
            f"{abs(s / SEED_BEST_SPEEDUP - 1):.0%} (different pairs: trained family, not the seed's)"
        )
    return _row("F6.1", verdict, f"{s:.2f}", note, seed, f"× at {length} tokens")


def ranking_length(pairs: pd.DataFrame) -> int | None:
    """The longest output length at which at least ``MIN_PAIRS`` pairs have a speedup (None: no such length)."""
    d = _measured(pairs)
    if d.empty:
        return None
    n = d.groupby("length")["pair"].nunique()
    ok = n[n >= MIN_PAIRS]
    return int(ok.index.max()) if len(ok) else None


def _spearman(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(stats.spearmanr(x[ok], y[ok]).statistic)


def length_trends(per_prompt: pd.DataFrame, method: str = "assisted") -> pd.DataFrame:
    """Per pair of ``method`` with ≥3 lengths: Spearman ρ of speedup against output length and the change from
    the shortest to the longest length, on the prompts that reached the pair's longest length (medians
    over them), so that every length of a pair compares the same prompts (``per_prompt``:
    :func:`servelab.studies.s06_hf_assisted.analysis.speedups`)."""
    cols = ["pair", "lengths", "prompts", "rho", "change"]
    d = per_prompt[per_prompt["method"] == method].dropna(subset=["speedup"]) if len(per_prompt) else per_prompt
    rows = []
    for pair, g in d.groupby("pair") if len(d) else []:
        full = g[g["prompt"].isin(g.loc[g["length"] == g["length"].max(), "prompt"])]
        med = full.groupby("length")["speedup"].median().sort_index()
        if len(med) >= 3:
            rho = _spearman(med.index, med.values)
            rows.append(
                dict(
                    pair=pair,
                    lengths=len(med),
                    prompts=full["prompt"].nunique(),
                    rho=0.0 if np.isnan(rho) else rho,  # a constant speedup: no trend
                    change=float(med.iloc[-1] / med.iloc[0] - 1),
                )
            )
    return pd.DataFrame(rows, columns=cols)


def f62_what_decides(pairs: pd.DataFrame, per_prompt: pd.DataFrame) -> dict:
    """F6.2: does the speedup fall with the cost ratio c (across pairs, at the longest length at which
    ``MIN_PAIRS`` pairs ran) and rise with output length (within each pair, over the lengths it ran, see
    :func:`length_trends`)? Each "decides" if |ρ| ≥ 0.5 in the expected direction (and, for length, the
    speedup moves ≥ 5% from the shortest to the longest output). α's correlation is reported beside.

    holds: both decide; changes: one does; fails: neither.
    """
    length = ranking_length(pairs)
    d = _measured(pairs)
    d = d[d["length"] == length] if length is not None else d.iloc[:0]
    trends = length_trends(per_prompt)
    per_pair = list(zip(trends["rho"], trends["change"]))
    if length is None or not per_pair:
        got = _measured(pairs)["pair"].nunique() if len(pairs) else 0
        return _row(
            "F6.2",
            "fails",
            "not measured",
            f"needs ≥{MIN_PAIRS} pairs at one length and ≥3 lengths; got {got} pairs",
            "c and length decide",
            "Spearman ρ",
        )
    rho_c = _spearman(d["cost_ratio"], d["speedup_median"])
    rho_a = _spearman(d["alpha"], d["speedup_median"])
    rho_len = float(np.median([r for r, _ in per_pair]))
    change = float(np.median([c for _, c in per_pair]))
    c_decides = rho_c <= -DECIDES_RHO
    len_decides = rho_len >= DECIDES_RHO and change >= MATERIAL_CHANGE
    verdict = "holds" if c_decides and len_decides else ("changes" if c_decides or len_decides else "fails")
    note = (
        f"across {len(d)} pairs at {length} tokens, speedup vs cost ratio c: ρ = {rho_c:+.2f}; vs greedy "
        f"agreement α: ρ = {rho_a:+.2f}; within a pair, vs output length ({len(per_pair)} pairs with ≥3 "
        f"lengths, up to {int(trends['lengths'].max())} lengths on the prompts that reached the pair's longest): "
        f"median ρ = {rho_len:+.2f}, median change {change:+.0%} from the shortest to the longest output"
    )
    if not c_decides:
        note += (
            "; the speedup rises with c, against the claim"
            if rho_c >= DECIDES_RHO
            else "; the cost ratio does not order the pairs' speedups"
        )
    if not len_decides:
        note += (
            "; the speedup falls with output length, against the claim"
            if rho_len <= -DECIDES_RHO and change <= -MATERIAL_CHANGE
            else "; output length hardly moves the speedup"
        )
    if np.isfinite(rho_a) and abs(rho_a) > abs(rho_c if np.isfinite(rho_c) else 0):
        note += "; α orders the pairs more strongly than c does"
    return _row(
        "F6.2", verdict, f"ρ_c = {rho_c:+.2f}, ρ_length = {rho_len:+.2f}", note, "c and length decide", "Spearman ρ"
    )


def findings(pairs: pd.DataFrame, per_prompt: pd.DataFrame) -> list[dict]:
    """F6.1 and F6.2 from the pair × length table and the per-prompt speedups (only what ran)."""
    return [f61_best_pair(pairs), f62_what_decides(pairs, per_prompt)]
