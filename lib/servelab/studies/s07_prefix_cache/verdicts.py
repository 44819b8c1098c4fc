"""Verdicts on the seed's claims F7.1–F7.4, computed from the measured tables (never typed).

F7.1–F7.3 are measured on the engine; ``tested_on`` (``common.tested_on.model_tested_on``) names its model. F7.4
is a property of the cache policies and the popularity law, measured in the policy simulator with no model.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
from scipy import stats

from servelab.studies.common.findings import Finding
from servelab.studies.s07_prefix_cache.optimum import static_optimum

SEED_SPEEDUP_512 = 2.41  # F7.1: TTFT speedup with a 512-token shared prefix
SEED_PREFIX = 512
SEED_TURN_SPEEDUP = 2.06  # F7.2: speedup reached after 10 turns
SEED_TURNS = 10
SEED_BREAKEVEN = {512: 2, 128: 12}  # F7.3: breakeven batch size per prefix length
SEED_LFU_HIT = 0.82  # F7.4: LFU, Zipf α = 2.0, 4 slots
SEED_ALPHA, SEED_SLOTS = 2.0, 4

SPEEDUP_TOLERANCE = 0.25  # a speedup within ±25% of the seed's counts as the same
HIT_TOLERANCE = 0.03  # hit rates within ±3 percentage points count as the same

CLAIMS = {
    "F7.1": "2.41× speedup with a 512-token shared prefix",
    "F7.2": "multi-turn speedup grows to 2.06× over 10 turns",
    "F7.3": "batch sharing breaks even at n=2 requests for a 512-token prefix, n=12 for 128",
    "F7.4": "LFU with Zipf α=2.0 popularity reaches an 82% hit rate with only 4 slots",
}


def _judge(fid: str, seed_value: str, unit: str, tested_on: str):
    """A ``Finding`` for ``fid`` with what every outcome of its rule shares; the rule adds the rest."""
    return partial(Finding, id=fid, claim=CLAIMS[fid], seed_value=seed_value, unit=unit, tested_on=tested_on)


def _close(x: float, ref: float, tol: float = SPEEDUP_TOLERANCE) -> bool:
    return abs(x / ref - 1.0) <= tol


def _saving_at(sp: pd.DataFrame, p: int) -> str:
    """What the cache saves at ``p`` tokens in the repeat judged: its uncached minus cached TTFT there, with their
    ratio. The page's table gives each column's median over repeats on its own, and a note quoting those read
    "4.19 → 2.80 ms" (1.50×, from two different repeats) beside the headline's 1.42×."""
    row = sp[sp["prefix_tokens"] == p]
    if row.empty or not {"uncached_ms", "cached_ms"} <= set(sp.columns):
        return ""
    u, c = float(row["uncached_ms"].iloc[0]), float(row["cached_ms"].iloc[0])
    return (
        f". In this repeat, at {p:,} tokens the cache saves {u - c:.2f} ms of the first token's time ({u:.2f} → "
        f"{c:.2f} ms measured, {u / c:.2f}×)"
    )


def _bend(said: pd.DataFrame) -> str:
    """How the uncached times bend upward at the longest prefix (attention grows with the square of the prompt): the
    cost per token of the last step against that of every step before it. A line through all of them then tilts
    up and its intercept falls below the fixed cost the shortest prompt plainly pays."""
    t = said.sort_values("prefix_tokens")
    if len(t) < 3 or "uncached_ms" not in t:
        return ""
    x, y = t["prefix_tokens"].to_numpy(float), t["uncached_ms"].to_numpy(float)
    top, rest = (y[-1] - y[-2]) / (x[-1] - x[-2]), (y[-2] - y[0]) / (x[-2] - x[0])
    return (
        f"; the times bend upward at the top ({int(x[-2]):,} → {int(x[-1]):,} tokens costs {top * 1e3:.2f} µs per "
        f"token, against {rest * 1e3:.2f} µs from {int(x[0]):,} to {int(x[-2]):,}), which tilts the line and pulls "
        f"its intercept below the fixed cost that the {y[0]:.2f} ms measured at {int(x[0]):,} tokens shows"
    )


def _prefill_cost_note(costs: pd.DataFrame | None, over: str = "the sweep", bend: str = "") -> str:
    """What the fitted lines say: the fixed cost every request pays, and a token's cost with and without the cache;
    ``over``: what the lines were fitted to; ``bend``: why a negative intercept is the line's (``_bend``)."""
    if costs is None or costs.empty or costs["fixed"].isna().any():
        return ""
    c = costs.set_index("mode")
    u, k = c.loc["uncached"], c.loc["cached"]

    def line(f, what):
        return f"{f.fixed:.1f} ms {'+' if f.slope >= 0 else '−'} {abs(f.slope) * 1e3:.2f} µs per {what}"

    # a negative intercept is the line's, not a cost: no request pays less than nothing
    fixed = (
        f", against a fixed {u.fixed:.1f} ms that every request pays"
        if u.fixed > 0
        else f"; the uncached line, one straight line over every length, has a negative intercept ({u.fixed:.1f} ms)"
        + bend
    )
    return (
        f". Fitted over {over}: uncached TTFT ≈ {line(u, 'prompt token')} (r² {u.r2:.2f}); cached ≈ "
        f"{line(k, 'cached token')} (r² {k.r2:.2f})" + fixed
    )


MEDIANS = " (median over repeats, as tabled)"  # what a note quoting the page's tables says of its numbers


def f71(
    sp: pd.DataFrame,
    costs: pd.DataFrame | None = None,
    tested_on: str = "",
    shown: tuple[pd.DataFrame, pd.DataFrame | None] | None = None,
) -> Finding:
    """``sp``: ``prefix_length.speedups`` (prefix_tokens, speedup, …); ``costs``: ``cost_fit.prefill_costs``
    (for the note). Holds if the speedup at 512 tokens is within ``SPEEDUP_TOLERANCE`` of 2.41×; changes if it
    differs (the note says where the seed's speedup is reached); fails if caching never beats recomputing.
    ``shown``: the (speedups, fits) the page tabulates, medians over repeats: the note's curve and fits quote
    them, so that it reads as the tables beside it do; the verdict reads ``sp`` alone."""
    judge = _judge("F7.1", f"{SEED_SPEEDUP_512:.2f}× at {SEED_PREFIX} tokens", "× TTFT", tested_on)
    if sp.empty:
        return judge(measured_value="no data", verdict="fails", note="no prefix length was measured in both modes")
    sp = sp.sort_values("prefix_tokens")
    at = sp.iloc[(sp["prefix_tokens"] - SEED_PREFIX).abs().argmin()]
    p, x = int(at.prefix_tokens), float(at.speedup)
    pooled = shown is not None and not shown[0].empty
    said, fits = (shown[0].sort_values("prefix_tokens"), shown[1]) if pooled else (sp, costs)
    curve = ", ".join(f"{int(r.prefix_tokens):,}: {r.speedup:.2f}×" for r in said.itertuples())
    curve = f"By prefix length{MEDIANS if pooled else ''}: {curve}"
    reach = said[said["speedup"] >= SEED_SPEEDUP_512]
    where = (
        f"the seed's {SEED_SPEEDUP_512}× is first reached at a {int(reach.prefix_tokens.iloc[0]):,}-token prefix"
        if len(reach)
        else f"no prefix length up to {int(said.prefix_tokens.max()):,} reaches {SEED_SPEEDUP_512}×"
    )
    measured = f"{x:.2f}× at {p} tokens (IQR-based range {at.speedup_lo:.2f}–{at.speedup_hi:.2f}×)"
    fit = _prefill_cost_note(fits, "those medians" if pooled else "the sweep", _bend(said))
    fit += _saving_at(sp, p)  # the repeat judged: its own two times give its speedup
    if sp["speedup"].max() <= 1.0:
        return judge(
            measured_value=measured,
            verdict="fails",
            note=f"the cached prefix never made the first token faster; {curve[0].lower()}{curve[1:]}{fit}",
        )
    verdict = "holds" if _close(x, SEED_SPEEDUP_512) else "changes"
    direction = "" if verdict == "holds" else (" smaller" if x < SEED_SPEEDUP_512 else " larger")
    note = (
        f"speedup{direction} at {p} tokens; {where}; the largest, {said.speedup.max():.2f}×, at "
        f"{int(said.loc[said.speedup.idxmax(), 'prefix_tokens']):,} tokens. {curve}{fit}"
    )
    return judge(
        measured_value=measured,
        verdict=verdict,
        note=note,
        headline=x,
        headline_unit=f"× TTFT speedup at a {p}-token prefix (holds within ±{SPEEDUP_TOLERANCE:.0%} of "
        f"{SEED_SPEEDUP_512})",
    )


def _ttft_by_turn(turns: pd.DataFrame) -> pd.DataFrame:
    t = turns[turns["metric"] == "ttft"].sort_values("turn") if "metric" in turns else turns.sort_values("turn")
    return t[t["turn"] >= 2]  # turn 1 has no history to reuse


def f72(turns: pd.DataFrame, tested_on: str = "", shown: pd.DataFrame | None = None) -> Finding:
    """``turns``: per-turn speedups (turn, speedup, metric). The TTFT speedup decides: holds if it grows with the
    turn (Spearman ρ > 0.5) and at turn 10 is within tolerance of 2.06×; changes if it grows to another value;
    fails if it does not grow. ``shown``: the per-turn speedups the page tabulates (medians over repeats), which the
    note's curve quotes; the verdict reads ``turns`` alone."""
    judge = _judge("F7.2", f"{SEED_TURN_SPEEDUP:.2f}× after {SEED_TURNS} turns", "× TTFT", tested_on)
    t = _ttft_by_turn(turns)
    if len(t) < 3:
        return judge(
            measured_value="too few turns", verdict="fails", note="fewer than three turns with history measured"
        )
    at = t.iloc[(t["turn"] - SEED_TURNS).abs().argmin()]
    rho = float(stats.spearmanr(t["turn"], t["speedup"]).statistic)
    x = float(at.speedup)
    measured = f"{x:.2f}× at turn {int(at.turn)} (TTFT)"
    pooled = shown is not None and not shown.empty
    said = shown if pooled else turns
    e2e = said[(said.get("metric") == "turn") & (said["turn"] == at.turn)] if "metric" in said else pd.DataFrame()
    extra = (
        f"; the whole turn (first token + {int(e2e.output_tokens.iloc[0])}-token reply) is "
        f"{float(e2e.speedup.iloc[0]):.2f}× faster"
        if len(e2e) and "output_tokens" in e2e
        else ""
    )
    curve = ", ".join(f"{int(r.turn)}: {r.speedup:.2f}×" for r in _ttft_by_turn(said).itertuples())
    rho_of, of = (" in this repeat", MEDIANS) if pooled else ("", "")
    note = f"Spearman ρ(turn, speedup) = {rho:.2f}{rho_of}{extra}. TTFT speedup by turn{of}: {curve}"
    if not rho > 0.5:
        return judge(measured_value=measured, verdict="fails", note="the speedup does not grow with the turn; " + note)
    verdict = "holds" if _close(x, SEED_TURN_SPEEDUP) else "changes"
    return judge(
        measured_value=measured,
        verdict=verdict,
        note=note,
        headline=x,
        headline_unit=f"× TTFT speedup at turn {int(at.turn)} (holds within ±{SPEEDUP_TOLERANCE:.0%} of "
        f"{SEED_TURN_SPEEDUP} where it grows with the turn, ρ > 0.5)",
    )


def _breakeven_text(r) -> str:
    if np.isnan(r.breakeven_n):
        return f"never up to n={int(r.max_n)} at {int(r.prefix_tokens):,}"
    return f"n={int(r.breakeven_n)} at {int(r.prefix_tokens):,}"


def _n_or_never(n: float) -> str:
    return "—" if pd.isna(n) else "never" if np.isinf(n) else f"{int(n)}"


def breakevens_each(by_repeat: pd.DataFrame) -> pd.Series:
    """Per prefix length, each repeat's breakeven in run order ("4, 2, 4"). ``by_repeat``: (repeat, prefix_tokens,
    breakeven_n), ``repeat`` the repeat's place in run order from 0; a repeat that never broke even reads "never",
    one without that prefix length "—"."""
    t = by_repeat.assign(breakeven_n=by_repeat["breakeven_n"].astype(float).fillna(np.inf))
    t = t.pivot_table(index="prefix_tokens", columns="repeat", values="breakeven_n", aggfunc="first").sort_index()
    return t.apply(lambda row: ", ".join(_n_or_never(n) for n in row), axis=1)


def _breakevens_by_repeat(by_repeat: pd.DataFrame) -> str:
    """Each repeat's breakeven per prefix length ("n=4, 2, 4 at 128; n=2, 2, 2 at 512 (in repeats 1, 2 and 3)"):
    the value quoted one repeat's alone, while at 128 tokens, which decides the verdict, the repeats measured 4, 2
    and 4."""
    each = breakevens_each(by_repeat)
    names = [str(int(k) + 1) for k in sorted(by_repeat["repeat"].unique())]
    said = "; ".join(f"n={n} at {int(p):,}" for p, n in each.items())
    return f"{said} (in repeats {', '.join(names[:-1])} and {names[-1]})"


RATIO_MEDIANS = " (each n's median over repeats of a repeat's own ratio, as tabled)"


def _sharing_note(be: pd.DataFrame, costs: pd.DataFrame | None, of: str = "", fitted: str = "fitted") -> str:
    """The time ratios by n and the fitted cost of each further request; ``of``: where the ratios come from;
    ``fitted``: what the lines were fitted to."""
    ratios = " | ".join(
        f"{int(r.prefix_tokens):,} tokens: {r.ratios}" for r in be.sort_values("prefix_tokens").itertuples()
    )
    note = f"time independent / shared{of}: {ratios}"
    if costs is not None and not costs.empty and costs["slope"].notna().all():
        c = costs.set_index(["prefix_tokens", "sharing"])["slope"]
        note += f". Each further request costs ({fitted}, ms): " + "; ".join(
            f"{int(p):,} tokens: independent {c[(p, 'independent')]:.2f}, shared {c[(p, 'shared')]:.2f}"
            for p in sorted(costs["prefix_tokens"].unique())
            if (p, "independent") in c and (p, "shared") in c
        )
    return note


def f73(
    be: pd.DataFrame,
    costs: pd.DataFrame | None = None,
    tested_on: str = "",
    shown: tuple[pd.DataFrame, pd.DataFrame | None] | None = None,
    by_repeat: pd.DataFrame | None = None,
) -> Finding:
    """``be``: ``batch_sharing.breakeven``. Holds if sharing breaks even at n ≤ 2 for 512 tokens and at a batch
    bracketing 12 (8–16) for 128; changes if it breaks even elsewhere; fails if it never breaks even. ``shown``:
    the (breakevens, fits) the page tabulates, each ratio the median over repeats of each repeat's own and the fits
    to the median times, which the note's ratios and costs quote; ``by_repeat``: every repeat's breakevens (repeat,
    prefix_tokens, breakeven_n), which the value gives, so that the 128-token breakeven that decides is shown for
    each repeat, not one repeat's alone. The verdict reads ``be`` alone."""
    judge = _judge("F7.3", "n=2 at 512 tokens, n=12 at 128", "requests", tested_on)
    if be.empty:
        return judge(measured_value="no data", verdict="fails", note="no prefix length was measured both ways")
    be = be.sort_values("prefix_tokens")
    several = by_repeat is not None and by_repeat["repeat"].nunique() > 1
    measured = _breakevens_by_repeat(by_repeat) if several else "; ".join(_breakeven_text(r) for r in be.itertuples())
    pooled = shown is not None and not shown[0].empty
    note = _sharing_note(*shown, RATIO_MEDIANS, "fitted to the median times") if pooled else _sharing_note(be, costs)
    if be["breakeven_n"].isna().all():
        return judge(measured_value=measured, verdict="fails", note="sharing never broke even; " + note)
    by_p = be.set_index("prefix_tokens")["breakeven_n"]
    ok512 = SEED_PREFIX in by_p and by_p[SEED_PREFIX] <= 2
    ok128 = 128 in by_p and not np.isnan(by_p[128]) and 8 <= by_p[128] <= 16
    verdict = "holds" if ok512 and ok128 else "changes"
    return judge(
        measured_value=measured,
        verdict=verdict,
        note=note,
        headline=float(by_p[SEED_PREFIX]) if SEED_PREFIX in by_p else None,
        headline_unit=f"requests at which sharing a {SEED_PREFIX}-token prefix breaks even (holds at ≤ 2, with 8–16 "
        "at 128 tokens)",
    )


# the policies as the page names them (its F7.4 section defines each in words)
POLICY_NAMES = {
    "lru": "LRU",
    "lfu": "LFU",
    "lfu_perfect": "perfect LFU",
    "belady": "Belady's MIN",
    "radix": "radix",
    "fifo": "FIFO",
}


def policy_name(policy: str) -> str:
    return POLICY_NAMES.get(str(policy), str(policy))


def _radix_unit(same: pd.DataFrame) -> str:
    """Why radix can score above Belady's MIN on the same stream: MIN is the offline optimum of a whole-prefix cache,
    while radix counts blocks, and its prefixes share their system prompt's blocks, so a request whose own blocks
    are not cached still hits those. Radix's static optimum, in blocks, is higher for the same reason."""
    by = same.set_index("policy")
    if "radix" not in by.index or "belady" not in by.index:
        return ""
    opt = f" (its static optimum in blocks: {by.loc['radix', 'optimum']:.1%})" if "optimum" in by else ""
    return (
        f". Radix's rate counts blocks, not whole prefixes{opt}: its prefixes share a system prompt's blocks, which "
        "a request whose prefix is not cached still hits; Belady's MIN is the offline bound for the whole-prefix "
        "caches, not for radix"
    )


def f74(sim: pd.DataFrame, n_prefixes: int, n_requests: int | None = None) -> Finding:
    """``sim``: ``simulate.hit_rates``. The claim is that LFU *reaches* 82%: holds if plain LFU at α = 2.0 with 4
    slots scores at least 82% less ``HIT_TOLERANCE`` (it cannot beat the static top-4 optimum beyond sampling
    noise, which the note gives); changes if it falls short."""
    stream = f"{n_requests:,} requests" if n_requests else "a stream"
    judge = _judge(
        "F7.4",
        f"{SEED_LFU_HIT:.0%} (LFU, α={SEED_ALPHA}, {SEED_SLOTS} slots)",
        "hit rate",
        f"the policy simulator (no model, no GPU): {stream} over {n_prefixes} prefixes, Zipf α={SEED_ALPHA}",
    )
    row = sim[(sim["policy"] == "lfu") & (sim["alpha"] == SEED_ALPHA) & (sim["capacity"] == SEED_SLOTS)]
    if row.empty:
        return judge(
            measured_value="not simulated",
            verdict="fails",
            note=f"the sweep lacks LFU at α={SEED_ALPHA} with {SEED_SLOTS} slots",
        )
    x = float(row["hit_rate"].iloc[0])
    top = {k: static_optimum(SEED_ALPHA, n_prefixes, k) for k in (SEED_SLOTS - 1, SEED_SLOTS)}
    others = sim[(sim["alpha"] == SEED_ALPHA) & (sim["capacity"] == SEED_SLOTS) & (sim["policy"] != "lfu")]
    note = (
        f"static optimum over {n_prefixes} prefixes: top-{SEED_SLOTS} {top[SEED_SLOTS]:.1%}, top-{SEED_SLOTS - 1} "
        f"{top[SEED_SLOTS - 1]:.1%}; plain LFU restarts a readmitted prefix at count 1, so one slot churns and "
        f"4 slots behave like the top 3 plus a little. Same stream: "
        + ", ".join(f"{policy_name(r.policy)} {r.hit_rate:.1%}" for r in others.itertuples())
        + _radix_unit(others)
    )
    verdict = "holds" if x >= SEED_LFU_HIT - HIT_TOLERANCE else "changes"
    return judge(
        measured_value=f"{x:.1%}",
        verdict=verdict,
        note=note,
        headline=100 * x,
        headline_unit=f"% LFU hit rate at α = {SEED_ALPHA}, {SEED_SLOTS} slots (holds from "
        f"{100 * (SEED_LFU_HIT - HIT_TOLERANCE):.1f}%)",
    )
