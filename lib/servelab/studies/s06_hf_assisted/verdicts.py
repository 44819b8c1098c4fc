"""Verdicts on the seed's Study 6 claims (F6.1, F6.2), computed from the measured tables by stated rules.

Both speak of two things, each labelled in ``tested_on``: the real pair whose speedup was measured (SmolLM2 and
its distilled drafts, by default) and the seed's shapes, whose HF cost ratio c was measured with random weights
(``seed_costs``). A speedup counts only where at least ``MIN_PROMPTS`` prompts reached that length: no verdict
rests on one prompt. The RTX 2070 values below are the seed's, quoted from ``shared/seed-studies.md``.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
from scipy import stats

from servelab.studies.common.findings import Finding
from servelab.studies.common.tested_on import tested_on as models_words
from servelab.studies.common.tested_on import weights

SEED_BEST_SPEEDUP = 1.747  # F6.1, RTX 2070
SEED_BEST_PAIR = "distilgpt2 → gpt2-medium"  # F6.1, RTX 2070
SEED_LENGTH = 512  # F6.1: output tokens
HOLDS_BAND = 0.20  # F6.1 holds if the best pair's speedup is within ±20% of the seed's
DECIDES_RHO = 0.5  # F6.2: |Spearman ρ| at least this for a parameter to "decide" the speedup
MATERIAL_CHANGE = 0.05  # F6.2: and the speedup moves by at least 5% over the range of output lengths
MIN_PAIRS = 3  # F6.2: pairs needed at one output length to rank them by c
MIN_PROMPTS = 8  # a (pair, length) speedup counts only over at least this many prompts

CLAIMS = {
    # a clause, not "pair: value", since a takeaway puts the measured value after a colon (page.finding_sentence)
    "F6.1": "the best pair, distilgpt2 → gpt2-medium, speeds generation up 1.747× at 512 output tokens",
    "F6.2": "cost ratio and output length are the parameters that decide the speedup",
}


def min_prompts_for(profile: str, n_prompts: int) -> int:
    """``MIN_PROMPTS``; the smoke profile (CPU, CI) runs fewer prompts than that and uses all it has."""
    return min(MIN_PROMPTS, n_prompts) if profile == "smoke" else MIN_PROMPTS


def most_prompts(pairs: pd.DataFrame) -> int:
    """The most prompts any assisted (pair, length) speedup rests on (0: none measured)."""
    if not len(pairs) or "prompts" not in pairs:
        return 0
    d = pairs.dropna(subset=["speedup_median"])
    return int(d["prompts"].max()) if len(d) else 0


def best_gamma(alpha: float, c: float):
    """``servelab.speculative.leviathan.best_gamma``, imported when called (it imports scipy's root finder, which the
    reporting path needs only where seed costs exist)."""
    from servelab.speculative.leviathan import best_gamma as best

    return best(alpha, c)


def _too_few(pairs: pd.DataFrame, min_prompts: int) -> str:
    """Why nothing qualified, where the reason is the prompts per point ("" otherwise)."""
    most = most_prompts(pairs)
    if not most or most >= min_prompts:
        return ""
    return f" (at most {most} prompt{'s' if most != 1 else ''} per point, below the {min_prompts} a point needs)"


def _short_of_pairs(pairs: pd.DataFrame, min_prompts: int) -> str:
    """Where points have their prompts but no length has ``MIN_PAIRS`` pairs on them: each pair's prompts at the
    longest length it ran ("" where fewer than ``MIN_PAIRS`` pairs ran at all, or one length qualifies). A budget
    that cut one prompt too many reads as "8, 7 and 7", not as "1 pair"."""
    if not len(pairs) or not {"pair", "length", "prompts"} <= set(pairs.columns):
        return ""
    d = pairs.dropna(subset=["speedup_median"])
    if d["pair"].nunique() < MIN_PAIRS or ranking_length(pairs, min_prompts) is not None:
        return ""
    if most_prompts(pairs) < min_prompts:  # no point has its prompts at all: ``_too_few`` says that
        return ""
    longest = int(d["length"].max())
    at = d[d["length"] == longest].sort_values(["prompts", "pair"], ascending=[False, True])
    enough = int((at["prompts"] >= min_prompts).sum())
    counts = "; ".join(f"{r.pair}: {int(r.prompts)}" for r in at.itertuples())
    return f"at {longest} tokens, {enough} of {len(at)} pairs ran on ≥ {min_prompts} prompts ({counts})"


def _thin_value(pairs: pd.DataFrame, min_prompts: int) -> str:
    most = most_prompts(pairs)
    return f"≤ {most} prompts per point" if 0 < most < min_prompts else "not measured"


def _measured(pairs: pd.DataFrame, min_prompts: int = MIN_PROMPTS) -> pd.DataFrame:
    if not len(pairs):
        return pairs
    d = pairs.dropna(subset=["speedup_median"])
    return d[d["prompts"] >= min_prompts]


def seed_shapes(seed_costs: pd.DataFrame | None) -> str:
    """The seed's shape pairs whose cost was measured, for ``tested_on``, with where their weights came from (read
    off the specs that ran: a typed "config:" stood in for it)."""
    if seed_costs is None or seed_costs.empty:
        return "seed's shapes: not measured"
    pairs = ", ".join(seed_costs["pair"])
    specs = [s for c in ("draft", "target") if c in seed_costs for s in seed_costs[c].astype(str)]
    if not specs:
        return f"cost at the seed's shapes: {pairs} (HF generate)"
    if {weights(s) for s in specs} == {"random weights"}:
        return f"cost at the seed's shapes: {pairs} (architecture-exact, random weights; HF generate)"
    return f"cost at the seed's shapes: {pairs}; {models_words(specs, setting='HF generate')}"


def implausible_seed_costs(per_repeat: list[tuple[str, pd.DataFrame]]) -> dict[str, str]:
    """Per seed pair, the repeats whose c has a draft with fewer parameters than its target step slower than it
    (c > 1 with a parameter ratio under 1), in words; pairs with none are absent. ``per_repeat``: (the repeat's name,
    its ``seed_costs``). Study 3 flags the same pattern in its own eager timings (``s03 verdicts.implausible_eager``);
    here one repeat's qwen2-0.5b → qwen2-1.5b read c = 1.15 where the other two read 0.86."""
    out: dict[str, list[str]] = {}
    for name, t in per_repeat:
        if t is None or t.empty or not {"c", "params_ratio"} <= set(t.columns):
            continue
        for r in t.itertuples():
            if r.c > 1 > r.params_ratio:
                ms = f" (draft step {r.draft_ms:.2f} ms, target {r.target_ms:.2f} ms)" if hasattr(r, "draft_ms") else ""
                out.setdefault(r.pair, []).append(
                    f"{name}'s c = {r.c:.2f}{ms} has a draft with {r.params_ratio:.2f}× the target's parameters step "
                    "slower than the target: not physically plausible, most likely host time in that repeat's eager "
                    "timings (Study 3 flags the same in its own eager ratios), so the median over the repeats is quoted"
                )
    return {pair: "; ".join(said) for pair, said in out.items()}


def _over_repeats(seed_costs: pd.DataFrame) -> str:
    """', each c the median over 3 repeats' where the table pools several repeats, else ''."""
    n = int(seed_costs["n_repeats"].max()) if "n_repeats" in seed_costs and seed_costs["n_repeats"].notna().any() else 1
    return f", each c the median over {n} repeats" if n > 1 else ""


def _each_c(r) -> str:
    """' (repeats 1.15 / 0.86 / 0.86)' for a pair with a flagged repeat (``implausible``), else ''."""
    return f" (repeats {r.c_each})" if getattr(r, "implausible", "") and getattr(r, "c_each", "") else ""


def _seed_cost_text(seed_costs: pd.DataFrame | None, alpha: float) -> str:
    """HF's c at each seed shape pair and, with the real pair's α, Leviathan's best speedup there. ``seed_costs``: one
    repeat's, or the median over the repeats (``n_repeats``, ``c_each`` and ``implausible`` then say so): a note
    quoting the repeat nearest the median *speedup* took that repeat's costs whatever their own spread, and read
    c = 1.15 and a prediction of 0.63× from a repeat whose draft stepped slower than its target."""
    if seed_costs is None or seed_costs.empty:
        return ""
    parts, flags = [], []
    for r in seed_costs.itertuples():
        text = f"{r.pair}: c = {r.c:.2f}{_each_c(r)}"
        if np.isfinite(alpha) and 0 < alpha < 1:
            g, imp = best_gamma(alpha, r.c)
            text += f", predicted {imp:.2f}× at γ = {g}"
        parts.append(text)
        if getattr(r, "implausible", ""):
            flags.append(f"for {r.pair}, {r.implausible}")
    alpha_said = f", α = {alpha:.2f} from the real pair" if np.isfinite(alpha) else ""
    head = f"; at the seed's shapes (random weights, HF eager{_over_repeats(seed_costs)}{alpha_said}): "
    return head + "; ".join(parts) + "".join(f"; {f}" for f in flags)


def _lookup_pays(per_prompt: pd.DataFrame | None, length: int) -> str:
    """Prompt lookup at ``length`` in this repeat, where it beats plain generate: it runs through the same assisted
    generation path without a draft model, so "assisted generation does not pay" said more than the pairs showed."""
    if per_prompt is None or not len(per_prompt) or "method" not in per_prompt:
        return ""
    d = per_prompt[(per_prompt["method"] == "prompt_lookup") & (per_prompt["length"] == length)]
    d = d.dropna(subset=["speedup"])
    if d.empty or d["speedup"].median() <= 1.0:
        return ""
    n = d["prompt"].nunique()
    return (
        f" (prompt lookup, HF's draft-free assisted mode, does: {d['speedup'].median():.2f}× at {length} tokens, "
        f"median over {n} prompt{'s' if n != 1 else ''} in this repeat)"
    )


def f61_best_pair(
    pairs: pd.DataFrame,
    seed_costs: pd.DataFrame | None = None,
    *,
    tested_on: str = "",
    min_prompts: int = MIN_PROMPTS,
    per_prompt: pd.DataFrame | None = None,
) -> Finding:
    """F6.1: the best assisted pair's median speedup at the longest output length any pair reached on at least
    ``min_prompts`` prompts, against 1.747× (``pairs``: ``analysis.pair_summary`` over lengths).

    inconclusive: no such length; fails: no pair speeds generate up (best ≤ 1); holds: within ±20% of the seed's;
    changes otherwise. ``per_prompt`` (``analysis.speedups``), where given, lets a failing note say whether prompt
    lookup pays."""
    d = _measured(pairs, min_prompts)
    seed = f"{SEED_BEST_SPEEDUP}× ({SEED_BEST_PAIR}, RTX 2070)"
    labelled = f"{tested_on} | {seed_shapes(seed_costs)}" if tested_on else seed_shapes(seed_costs)
    common = dict(id="F6.1", claim=CLAIMS["F6.1"], seed_value=seed, tested_on=labelled)
    if d.empty:
        note = f"no assisted pair reached any length on ≥ {min_prompts} prompts{_too_few(pairs, min_prompts)}"
        value = _thin_value(pairs, min_prompts)
        note += _seed_cost_text(seed_costs, np.nan)
        return Finding(**common, measured_value=value, unit="×", verdict="inconclusive", note=note)
    length = int(d["length"].max())
    d = d[d["length"] == length]
    best = d.loc[d["speedup_median"].idxmax()]
    s, c, a = float(best["speedup_median"]), best.get("cost_ratio", np.nan), best.get("alpha", np.nan)
    # the prompts are this repeat's (the page's speedup table gives the fewest of any repeat), and α is the same
    # per-token agreement as the α table's, over other prompts: "α = 0.36" stood beside a table's 0.417 unexplained
    note = (
        f"best pair {best['pair']} at {length} tokens: {s:.2f}× (quartiles {best['speedup_p25']:.2f}–"
        f"{best['speedup_p75']:.2f} over {int(best['prompts'])} prompts in this repeat), c = {c:.2f}, α = {a:.2f} "
        f"(greedy agreement on this repeat's timed outputs, median over prompts; the α table pools every position "
        f"of its own held-out prompts); {len(d)} pairs reached {length} tokens on ≥ {min_prompts} prompts in this "
        "repeat"
    )
    if length != SEED_LENGTH:
        note += f" (the RTX 2070's figure is at {SEED_LENGTH})"
    if s <= 1.0:
        verdict, why = "fails", "; no assistant_model pair beats plain generate" + _lookup_pays(per_prompt, length)
    elif abs(s / SEED_BEST_SPEEDUP - 1) <= HOLDS_BAND:
        verdict, why = "holds", f"; within ±{HOLDS_BAND:.0%} of the RTX 2070's best"
    else:
        verdict = "changes"
        side = "above" if s > SEED_BEST_SPEEDUP else "below"
        why = f"; {side} the RTX 2070's best by {abs(s / SEED_BEST_SPEEDUP - 1):.0%}"
    note += why + _seed_cost_text(seed_costs, float(a))
    return Finding(
        **common,
        measured_value=f"{s:.2f}",
        unit=f"× at {length} tokens",
        verdict=verdict,
        note=note,
        headline=s,
        headline_unit=f"× the best pair's median speedup at {length} tokens (holds within ±{HOLDS_BAND:.0%} of "
        f"{SEED_BEST_SPEEDUP})",
    )


def ranking_length(pairs: pd.DataFrame, min_prompts: int = MIN_PROMPTS) -> int | None:
    """The longest output length at which at least ``MIN_PAIRS`` pairs have a speedup (None: no such length)."""
    d = _measured(pairs, min_prompts)
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


def chance_orderings(n: int, at_most: float = -DECIDES_RHO) -> tuple[int, int]:
    """Of the n! orderings of ``n`` pairs by speedup, how many give a Spearman ρ against c of at most ``at_most``
    (with no ties): how often "c decides" would read by chance alone."""
    base = np.arange(n)
    hits = sum(_spearman(base, p) <= at_most + 1e-9 for p in permutations(base))
    return hits, int(np.prod(range(1, n + 1)))


def _chance(n_pairs: int) -> str:
    """Why a ρ over a handful of pairs is weak evidence: over 3 pairs ρ takes only ±1 and ±0.5, and half of all
    orderings reach the rule's −0.5."""
    if not 3 <= n_pairs <= 7:  # 7! orderings is still quick; more pairs make chance small
        return ""
    hits, total = chance_orderings(n_pairs)
    return (
        f" (over {n_pairs} pairs, {hits} of the {total:,} possible orderings give ρ ≤ −{DECIDES_RHO:g} by chance "
        "alone: weak evidence either way)"
    )


def _f62_note(n_pairs, length, rho_c, rho_a, trends, rho_len, change, c_decides, len_decides) -> str:
    note = (
        f"across {n_pairs} pairs at {length} tokens, speedup vs cost ratio c: ρ = {rho_c:+.2f}{_chance(n_pairs)}; "
        f"vs greedy agreement α: ρ = {rho_a:+.2f}; within a pair, vs output length ({len(trends)} pairs with ≥3 "
        f"lengths): median ρ = {rho_len:+.2f}, median change {change:+.0%} from the shortest to the longest output"
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
    return note


def _seed_c_range(seed_costs: pd.DataFrame | None) -> str:
    if seed_costs is None or seed_costs.empty:
        return ""
    parts = ", ".join(
        f"{r.pair} {r.c:.2f}"
        + (f" (repeats {r.c_each}, one not physically plausible: see F6.1's note)" if _each_c(r) else "")
        for r in seed_costs.itertuples()
    )
    return (
        f"; HF's c at the seed's shapes (random weights{_over_repeats(seed_costs)}): {parts}; the seed's F3.3 "
        "measured 1/1.18 = 0.85 for Qwen2-0.5B → 1.5B"
    )


def _draft_as_target(d: pd.DataFrame) -> str:
    """Which of the ranked pairs has a draft as its target, and why it is there: one target with k drafts gives k
    cost ratios, and the rule ranks pairs by c only from ``MIN_PAIRS``. "" where no pair does."""
    if d.empty or not {"draft", "target", "pair"} <= set(d.columns):
        return ""
    drafts = set(d["draft"])
    inner = d[d["target"].isin(drafts)]
    if inner.empty:
        return ""
    main = d[~d["target"].isin(drafts)]
    k = main["draft"].nunique()
    names = ", ".join(inner["pair"])
    one = len(inner) == 1
    return (
        f"; {'one' if one else len(inner)} of the {len(d)} pairs, {names}, {'has' if one else 'have'} a draft serving "
        f"as the target (the smallest draft drafting for the largest): the one real target with its {k} drafts gives "
        f"{k} cost ratio{'s' if k != 1 else ''}, and the rule ranks pairs by c only where at least {MIN_PAIRS} reached "
        "one length"
    )


def f62_what_decides(
    pairs: pd.DataFrame,
    per_prompt: pd.DataFrame,
    seed_costs: pd.DataFrame | None = None,
    *,
    tested_on: str = "",
    min_prompts: int = MIN_PROMPTS,
) -> Finding:
    """F6.2: does the speedup fall with the cost ratio c (across pairs, at the longest length at which
    ``MIN_PAIRS`` pairs ran on ≥ ``min_prompts`` prompts) and rise with output length (within each pair, over the
    lengths it ran, see :func:`length_trends`)? Each "decides" if |ρ| ≥ 0.5 in the expected direction (and, for
    length, the speedup moves ≥ 5% from the shortest to the longest output). α's correlation is reported beside.

    holds: both decide; changes: one does; fails: neither; inconclusive: too few pairs or lengths.
    """
    labelled = f"{tested_on} | {seed_shapes(seed_costs)}" if tested_on else seed_shapes(seed_costs)
    common = dict(id="F6.2", claim=CLAIMS["F6.2"], seed_value="c and length decide", unit="Spearman ρ")
    length = ranking_length(pairs, min_prompts)
    trends = length_trends(per_prompt)
    if length is None or trends.empty:
        got = _measured(pairs, min_prompts)["pair"].nunique() if len(pairs) else 0
        short = _short_of_pairs(pairs, min_prompts)
        need = f"needs ≥{MIN_PAIRS} pairs at one length on ≥ {min_prompts} prompts and ≥3 lengths"
        got_text = f"got {got} pair{'s' if got != 1 else ''}{_too_few(pairs, min_prompts)}"
        # the reason first, as a sentence of its own: the combined finding quotes a thin repeat's first sentence
        note = f"{short}. The rule {need}" if short else f"{need}; {got_text}"
        return Finding(
            **common,
            measured_value=_thin_value(pairs, min_prompts),
            verdict="inconclusive",
            note=note + _seed_c_range(seed_costs),
            tested_on=labelled,
        )
    d = _measured(pairs, min_prompts)
    d = d[d["length"] == length]
    rho_c = _spearman(d["cost_ratio"], d["speedup_median"])
    rho_a = _spearman(d["alpha"], d["speedup_median"])
    rho_len, change = float(trends["rho"].median()), float(trends["change"].median())
    c_decides = rho_c <= -DECIDES_RHO
    len_decides = rho_len >= DECIDES_RHO and change >= MATERIAL_CHANGE
    verdict = "holds" if c_decides and len_decides else ("changes" if c_decides or len_decides else "fails")
    note = _f62_note(len(d), length, rho_c, rho_a, trends, rho_len, change, c_decides, len_decides)
    note += _draft_as_target(d)
    return Finding(
        **common,
        measured_value=f"ρ_c = {rho_c:+.2f}, ρ_length = {rho_len:+.2f}",
        verdict=verdict,
        note=note + _seed_c_range(seed_costs),
        tested_on=labelled,
        headline=rho_c,
        headline_unit=f"Spearman ρ of the speedup against the cost ratio c across {len(d)} pairs at {length} tokens "
        f"(c decides at ≤ −{DECIDES_RHO:g}; the length trend is in the note)",
    )


def findings(
    pairs: pd.DataFrame,
    per_prompt: pd.DataFrame,
    seed_costs: pd.DataFrame | None = None,
    *,
    tested_on: str = "",
    min_prompts: int = MIN_PROMPTS,
) -> list[Finding]:
    """F6.1 and F6.2 from the pair × length table, the per-prompt speedups and the seed shapes' costs."""
    kw = dict(tested_on=tested_on, min_prompts=min_prompts)
    return [
        f61_best_pair(pairs, seed_costs, per_prompt=per_prompt, **kw),
        f62_what_decides(pairs, per_prompt, seed_costs, **kw),
    ]
