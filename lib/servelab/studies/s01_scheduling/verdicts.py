"""Verdicts on claims F1.1–F1.3, computed from the sweep's summary rows (never typed).

F1.1 and F1.2 compare paired runs only where both policies served the load: a run whose worst stall is unknown
(no request produced two tokens) or that had more than half its requests cut at the deadline is past its
capacity, and its stall or throughput says nothing about fairness, so that rate is left out of the pair.

Each claim is judged per model size, then combined: the same verdict on every model is the verdict; a
claim that holds on one size and not on another has *changed* (the note says where it holds). A model's median
cut within one noise width of a threshold (``cut_noise``: half the range of its per-rate cuts) is said so in the
note (F1.1, and F1.2's 5% stall-cut gate on the same statistic).

- **F1.1** (ChunkedPrefill cuts the worst-case decode stall, 58.6 → 34.1 ms on the RTX 2070, a 42% cut):
  the worst stall is the p99 of the per-request maximum inter-token gap (``stall.p99_of_max_itl``: one
  observation per completed request, a bootstrap interval over requests; the run's single maximum is shown beside
  it); at each rate measured with both policies (the same trace), the cut is 1 − ChunkedPrefill's /
  EagerContBatch's, and the model's cut is the median over rates. holds: a cut of 20–70% (the seed's size,
  give or take); changes: a cut, but larger than 70% or smaller than 20%; fails: no cut (≤ 5%).
- **F1.2** (a fairness mechanism, not a throughput optimiser): at the most loaded rate measured with both,
  the ratio of delivered token throughput, ChunkedPrefill / EagerContBatch. The stall cut is F1.1's (the p99 of the
  per-request maximum inter-token gap, median over rates). holds: the stall is cut (> 5%) and throughput rises at
  most 10%; changes: the stall is cut and throughput rises more than 10% (it is a throughput optimiser too);
  fails: no stall cut.
- **F1.3** (EagerContBatch gives the best mean TTFT and the highest throughput): among all policy
  settings of the rate sweep, EagerContBatch counts as best when within 5% (TTFT) or 3% (throughput) of
  the best. Mean TTFT is judged at every rate (best at half of them or more), throughput at the most
  loaded rate. holds: both; changes: one of the two; fails: neither. Since 2026-12-07 a rate's mean TTFT is
  ``common_ttft``'s: over the requests every setting was offered, a request with no first token by the earliest
  deadline counted at that deadline, so a setting that cuts its slowest requests is no longer credited for it
  (the mean over completed requests alone, ``mean_ttft_ms``, is the old rule's).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.common.findings import Finding, seed_value
from servelab.studies.common.tested_on import tested_on
from servelab.studies.common.thresholds import thresholds_near

# the policies as the seed named them, for the prose (the identifiers stay in the code and the CSVs)
SHOWN = {"fcfs": "FCFS", "eager_cont_batch": "EagerContBatch", "chunked_prefill": "ChunkedPrefill"}


def seed_setting(scheduler: str, budget) -> str:
    """A policy setting as the prose names it: ChunkedPrefill@512, EagerContBatch, FCFS."""
    name = SHOWN.get(scheduler, scheduler)
    return f"{name}@{int(budget)}" if scheduler == "chunked_prefill" else name


SEED_STALL_EAGER_MS = 58.6  # RTX 2070, the seed's EagerContBatch worst-case decode stall
SEED_STALL_CHUNKED_MS = 34.1  # RTX 2070, ChunkedPrefill
SEED_CUT = 1 - SEED_STALL_CHUNKED_MS / SEED_STALL_EAGER_MS
CLAIMS = {
    "F1.1": "ChunkedPrefill cuts the worst-case decode stall from 58.6 ms (EagerContBatch) to 34.1 ms",
    "F1.2": "ChunkedPrefill is a fairness mechanism, not a throughput optimizer",
    "F1.3": "EagerContBatch gives the best mean TTFT and the highest throughput",
}
CUT_HOLDS = (0.20, 0.70)
NO_CUT = 0.05
THROUGHPUT_GAIN = 1.10
TTFT_TIE, THROUGHPUT_TIE = 1.05, 0.97


def _seed_cut(claim: str) -> str:
    """The seed's value ("58.6 ms → 34.1 ms") with the cut it states, computed from its two numbers."""
    import re

    text = seed_value(claim)
    before, after = (float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)[:2])
    return f"{text} (a {1 - after / before:.0%} cut)"


def short(model: str) -> str:
    return model.split(":")[-1]


def _ok_rate_sweep(summary: pd.DataFrame) -> pd.DataFrame:
    if summary.empty or "status" not in summary:
        return summary.iloc[0:0]
    return summary[(summary["status"] == "ok") & (summary["sweep"] == "rate")]


MAX_CUT_SHARE = 0.5  # a run that cut more of its requests than this was past capacity


def _served(s: pd.DataFrame) -> pd.DataFrame:
    """Runs with a measured worst stall that did not cut most of their requests."""
    keep = s["max_itl_ms"].notna()
    if {"cut", "requests"} <= set(s.columns):
        keep &= s["cut"] <= MAX_CUT_SHARE * s["requests"]
    return s[keep]


def paired(summary: pd.DataFrame, reference_budget: int) -> pd.DataFrame:
    """Per model and rate fraction served by both (see ``_served``): EagerContBatch's and ChunkedPrefill's
    (at the reference budget) max stall, p99 ITL, delivered throughput and mean TTFT."""
    s = _served(_ok_rate_sweep(summary))
    cols = ["max_itl_ms", "itl_p99_ms", "delivered_tok_s", "mean_ttft_ms", "rate", "cut"]
    cols += [c for c in ("requests",) if c in s.columns]  # the cut share F1.1's and F1.2's text give
    cols += [c for c in STALL_COLUMNS if c in s.columns]
    e = s[s["scheduler"] == "eager_cont_batch"].set_index(["model", "rate_fraction"])[cols]
    c = s[(s["scheduler"] == "chunked_prefill") & (s["budget"] == reference_budget)].set_index(
        ["model", "rate_fraction"]
    )[cols]
    j = e.join(c, lsuffix="_eager", rsuffix="_chunked", how="inner").reset_index()
    j["stall_cut"] = 1 - j["max_itl_ms_chunked"] / j["max_itl_ms_eager"]
    j["throughput_ratio"] = j["delivered_tok_s_chunked"] / j["delivered_tok_s_eager"]
    return _with_p99_cut(j)


STALL = "max_itl_p99_ms"  # F1.1's worst stall: the p99 of the per-request maximum ITL (``stall``)
STALL_COLUMNS = (STALL, "max_itl_p99_lo_ms", "max_itl_p99_hi_ms")


def _with_p99_cut(j: pd.DataFrame) -> pd.DataFrame:
    """``stall_cut_p99``: 1 − ChunkedPrefill's / EagerContBatch's p99 of the per-request maximum ITL (NaN where a
    run predates the statistic)."""
    if f"{STALL}_eager" in j.columns:
        j["stall_cut_p99"] = 1 - j[f"{STALL}_chunked"] / j[f"{STALL}_eager"]
    else:
        j["stall_cut_p99"] = np.nan
    return j


def _stall_text(r, side: str) -> str:
    """ "152 [148–153] ms": a run's p99 of the per-request maximum ITL and its bootstrap interval."""
    return f"{r[f'{STALL}_{side}']:.1f} [{r[f'max_itl_p99_lo_ms_{side}']:.1f}–{r[f'max_itl_p99_hi_ms_{side}']:.1f}]"


def cut_shares(r) -> str:
    """ "ChunkedPrefill cut 32% of its requests, EagerContBatch 0%": the share of each policy's requests cut at the
    deadline in a paired row (a rate both served may still cut some)."""
    chunked, eager = (r[f"cut_{side}"] / r[f"requests_{side}"] for side in ("chunked", "eager"))
    return f"ChunkedPrefill cut {chunked:.0%} of its requests, EagerContBatch {eager:.0%}"


SERVED = f"served: at most {MAX_CUT_SHARE:.0%} of the requests cut at the deadline"


def _any_cut(r) -> bool:
    return "requests_chunked" in r and bool(r["cut_chunked"] > 0 or r["cut_eager"] > 0)


def over_models(n: int) -> str:
    """How a headline spans the model sizes: each is judged on its own number; the headline is their median."""
    return f"; median over {n} models" if n > 1 else ""


# a claim that reads one way on one model size and another way on the other did not carry over as the seed stated it
DISAGREE = "changes"
COMBINE_RULE = f"where the models differ, the claim reads {DISAGREE}"


def _differ(per_model: dict[str, str]) -> bool:
    return len(set(per_model.values())) > 1


def combine(per_model: dict[str, str]) -> str:
    return DISAGREE if _differ(per_model) else next(iter(per_model.values()))


def _where(per_model: dict[str, str]) -> str:
    """Each model's verdict, and the rule that joins them where they differ (the reader sees why "holds" on one
    model and "fails" on the other read "changes")."""
    said = "; ".join(f"{m}: {v}" for m, v in per_model.items())
    return said + (f" ({COMBINE_RULE})" if _differ(per_model) else "")


def _near_text(sentences: list[str]) -> str:
    said = [x for x in sentences if x]
    return (". Near a threshold: " + "; ".join(said)) if said else ""


def cut_noise(cuts: pd.Series) -> float:
    """The noise width of a model's median stall cut (a fraction): half the range of its per-rate cuts. Each rate
    is measured once, so how far the rates disagree is the only spread the median has; one rate gives none."""
    return float(cuts.max() - cuts.min()) / 2 if len(cuts) > 1 else float("nan")


def near_cut_thresholds(model: str, cuts: pd.Series, thresholds) -> str:
    """The sentence that a model's median cut lies within one noise width (``cut_noise``) of a rule's threshold,
    or "" where it does not."""
    cut, noise = float(np.median(cuts)), cut_noise(cuts)
    near = thresholds_near(cut, thresholds, noise)
    if not near:
        return ""
    edges = " and ".join(f"{t:.0%}" for t in near)
    return (
        f"{model}'s median cut {cut:.2%} is within one noise width (±{100 * noise:.1f} points, half the range of its "
        f"{len(cuts)} per-rate cuts, {cuts.min():.1%}–{cuts.max():.1%}) of the {edges} threshold: its verdict "
        "could go either way"
    )


def _f11_verdict(cut: float) -> str:
    return "fails" if cut <= NO_CUT else "holds" if CUT_HOLDS[0] <= cut <= CUT_HOLDS[1] else "changes"


def _f12_verdict(cut: float, ratio: float) -> str:
    return "fails" if cut <= NO_CUT else "changes" if ratio > THROUGHPUT_GAIN else "holds"


def _paired_models(j: pd.DataFrame):
    """Per model of the paired rates ``j``: (its short name, its rows, the median stall cut over its rates, its row at
    the most loaded rate): the numbers F1.1's and F1.2's rules take, computed in one place for ``f11``, ``f12`` and
    ``model_verdicts``."""
    for model, g in j.groupby("model", sort=False):
        yield short(model), g, float(np.median(g["stall_cut_p99"])), g.loc[g["rate_fraction"].idxmax()]


NOT_PAIRED = "no rate was measured with both EagerContBatch and ChunkedPrefill"


def judged_pairs(summary: pd.DataFrame, reference_budget: int) -> pd.DataFrame:
    """The paired rates F1.1's and F1.2's rules judge: those with a p99 stall cut (``paired``)."""
    return paired(summary, reference_budget).dropna(subset=["stall_cut_p99"])


def _pairs_tested_on(j: pd.DataFrame, dtype: str | None) -> str:
    return tested_on(j["model"], dtype=dtype, setting=f"{len(j)} paired runs (model × rate) served over HTTP")


def _per_model_finding(fid: str, per: dict[str, str], parts: list[str], rule: str, near=(), **fields) -> Finding:
    """A claim judged on each model on its own (``per``, and one ``parts`` sentence each), then combined: the note
    gives the rule, each model's verdict and any that lies near a threshold (``near``)."""
    return Finding(
        id=fid,
        claim=CLAIMS[fid],
        measured_value="; ".join(parts),
        verdict=combine(per),
        note=f"{rule} Per model: {_where(per)}" + _near_text(list(near)),
        **fields,
    )


def model_verdicts(summary: pd.DataFrame, reference_budget: int) -> dict[str, dict[str, str]]:
    """F1.1's and F1.2's verdict per model on one repeat's summary, by the same rules as ``f11`` and ``f12``:
    ``{"F1.1": {"llama-3-8b": "changes", ...}, "F1.2": {...}}`` (empty where no rate was paired)."""
    j = judged_pairs(summary, reference_budget)
    out: dict[str, dict[str, str]] = {"F1.1": {}, "F1.2": {}}
    for name, _, cut, top in _paired_models(j):
        out["F1.1"][name] = _f11_verdict(cut)
        out["F1.2"][name] = _f12_verdict(cut, float(top["throughput_ratio"]))
    return out


def possible_verdicts(per_model: dict[str, set[str]]) -> set[str]:
    """Every verdict ``combine`` could give over the models, where each model may read any of its set: one
    verdict means the claim's verdict does not depend on which of its repeats a model's part is taken from."""
    import itertools

    models = list(per_model)
    return {combine(dict(zip(models, pick, strict=True))) for pick in itertools.product(*per_model.values())}


def split_models(by_repeat: list[dict[str, str]]) -> list[str]:
    """The models whose verdicts disagree across repeats (``model_verdicts`` of each repeat, in run order)."""
    models = dict.fromkeys(m for rep in by_repeat for m in rep)
    return [m for m in models if len({rep[m] for rep in by_repeat if m in rep}) > 1]


def models_over_repeats(by_repeat: list[dict[str, str]]) -> str:
    """The sentence on one claim's per-model verdicts across repeats (``model_verdicts`` of each repeat, in run
    order): each model's verdict in every repeat, and, where a model's repeats disagree, whether the claim's
    verdict depends on it (``possible_verdicts``)."""
    models = list(dict.fromkeys(m for rep in by_repeat for m in rep))
    if not models or len(by_repeat) < 2:
        return ""
    seen = {m: [rep.get(m, "missing") for rep in by_repeat] for m in models}
    parts = [f"{m} {said[0]} in each" if len(set(said)) == 1 else f"{m} {', '.join(said)}" for m, said in seen.items()]
    split = split_models(by_repeat)
    text = f"Per model over the {len(by_repeat)} repeats: {'; '.join(parts)}"
    if any(_differ(rep) for rep in by_repeat):
        text += f" ({COMBINE_RULE})"
    if split:
        sets = {m: set(said) - {"missing"} for m, said in seen.items()}
        outcomes = possible_verdicts(sets)
        names = " and ".join(split)
        if len(outcomes) == 1:
            text += (
                f". {names}'s repeats disagree, so that part is inconclusive; the claim reads "
                f"{next(iter(outcomes))} whichever of them stands"
            )
        else:
            text += f". {names}'s repeats disagree, and the claim could read {' or '.join(sorted(outcomes))} by them"
    return text


def split_label(by_repeat: list[dict[str, str]]) -> str:
    """The bracket the value cell carries where a model's repeats disagree (``model_verdicts`` of each repeat, in run
    order): that part is inconclusive, with its repeats' verdicts, and whether the other models decide the claim
    (``possible_verdicts``); "" where every model's repeats agree."""
    split = split_models(by_repeat)
    if not split or len(by_repeat) < 2:
        return ""
    seen = {m: [rep.get(m, "missing") for rep in by_repeat] for m in dict.fromkeys(m for rep in by_repeat for m in rep)}
    parts = [f"{m} part inconclusive over the repeats ({', '.join(seen[m])})" for m in split]
    outcomes = possible_verdicts({m: set(said) - {"missing"} for m, said in seen.items()})
    steady = [m for m in seen if m not in split]
    if len(outcomes) == 1 and steady:
        parts.append(f"{' and '.join(steady)} decides: the claim reads {next(iter(outcomes))} whichever stands")
    return f" [{'; '.join(parts)}]"


def f11(summary: pd.DataFrame, reference_budget: int, dtype: str | None = None) -> Finding:
    j = judged_pairs(summary, reference_budget)
    if j.empty:
        return _missing("F1.1", "ms", NOT_PAIRED)
    per, parts, near, cuts = {}, [], [], []
    for name, g, cut, _ in _paired_models(j):
        cuts.append(100 * cut)
        per[name] = _f11_verdict(cut)
        near.append(near_cut_thresholds(name, g["stall_cut_p99"], (NO_CUT, *CUT_HOLDS)))
        worst = g.loc[g[f"{STALL}_eager"].idxmax()]
        parts.append(
            f"{name}: worst stall (p99 of per-request max ITL [95% CI]) {_stall_text(worst, 'eager')} → "
            f"{_stall_text(worst, 'chunked')} ms (maximum {worst['max_itl_ms_eager']:.1f} → "
            f"{worst['max_itl_ms_chunked']:.1f} ms) at {worst['rate_eager']:.2f} req/s"
            + (f" ({cut_shares(worst)} at the deadline)" if _any_cut(worst) else "")
            + f"; median cut over {len(g)} rates {cut:.0%}"
        )
    return _per_model_finding(
        "F1.1",
        per,
        parts,
        rule=f"ChunkedPrefill at a {reference_budget}-token budget vs EagerContBatch on the same traces; the cut in "
        f"the p99 of each request's worst inter-token gap, median over rates: holds for a 20-70% cut, changes "
        f"outside it, fails at <= 5%.",
        near=near,
        seed_value=_seed_cut("F1.1"),
        unit="ms (stalls), % (cuts)",
        tested_on=_pairs_tested_on(j, dtype),
        headline=float(np.median(cuts)),
        headline_unit=f"% cut in the p99 stall, median over rates{over_models(len(cuts))}",
        headline_parts=tuple(zip(per, cuts, strict=True)),
    )


def f12(summary: pd.DataFrame, reference_budget: int, dtype: str | None = None) -> Finding:
    j = judged_pairs(summary, reference_budget)
    if j.empty:
        return _missing("F1.2", "ratio", NOT_PAIRED)
    per, parts, near, ratios = {}, [], [], []
    for name, g, cut, top in _paired_models(j):
        near.append(near_cut_thresholds(name, g["stall_cut_p99"], (NO_CUT,)))
        ratio = float(top["throughput_ratio"])
        ratios.append(ratio)
        per[name] = _f12_verdict(cut, ratio)
        parts.append(
            f"{name}: throughput ×{ratio:.2f} at the most loaded rate both policies served, "
            f"{top['rate_eager']:.2f} req/s "
            f"({top['delivered_tok_s_chunked']:,.0f} vs {top['delivered_tok_s_eager']:,.0f} tok/s; {SERVED}"
            + (f", and {cut_shares(top)} there" if "requests_chunked" in top else "")
            + f"), stall cut {cut:.0%}"
        )
    return _per_model_finding(
        "F1.2",
        per,
        parts,
        rule="holds if the stall (the p99 of each request's worst inter-token gap, as F1.1) is cut (> 5%, median "
        "over rates) and throughput rises <= 10%; changes if it rises more; fails without a stall cut.",
        near=near,
        seed_value="stall cut, no throughput gain",
        unit="ChunkedPrefill / EagerContBatch delivered tokens/s",
        tested_on=_pairs_tested_on(j, dtype),
        headline=float(np.median(ratios)),
        headline_unit=f"× delivered tokens/s, ChunkedPrefill / EagerContBatch at the most loaded rate both served"
        f"{over_models(len(ratios))}",
        headline_parts=tuple(zip(per, ratios, strict=True)),
    )


COMMON_TTFT, COMPLETED_TTFT = "common_ttft_ms", "mean_ttft_ms"


def _ttft_column(s: pd.DataFrame) -> str:
    """Today's statistic where the summary has it (``common_ttft``), else (a legacy summary) the old one."""
    return COMMON_TTFT if COMMON_TTFT in s and s[COMMON_TTFT].notna().any() else COMPLETED_TTFT


def _censored_text(top: pd.DataFrame) -> str:
    """ "; at the top rate 40 of the 173 requests compared had no first token by the deadline under FCFS": where a
    setting at the most loaded rate was censored (empty where none was, or the statistic is the old one)."""
    if "common_censored" not in top or not (top["common_censored"].fillna(0) > 0).any():
        return ""
    worst = top.loc[top["common_censored"].idxmax()]
    return (
        f"; at the top rate {int(worst['common_censored'])} of the {int(worst['common_requests'])} requests "
        f"compared had no first token by the deadline under {seed_setting(worst['scheduler'], worst['budget'])}, "
        f"counted at it"
    )


def f13(summary: pd.DataFrame, dtype: str | None = None, ttft: str | None = None) -> Finding:
    """F1.3 by today's rule; ``ttft`` names the mean-TTFT column to judge (default: ``_ttft_column``; the old rule
    passes ``COMPLETED_TTFT``)."""
    s = _ok_rate_sweep(summary).copy()
    if s.empty or not (s["scheduler"] == "eager_cont_batch").any():
        return _missing("F1.3", "ms, tok/s", "EagerContBatch was not measured")
    ttft = ttft or _ttft_column(s)
    s["setting"] = np.where(
        s["scheduler"] == "chunked_prefill", s["scheduler"] + "@" + s["budget"].astype(str), s["scheduler"]
    )
    per, parts, shares, share_of = {}, [], [], {}
    for model, g in s.groupby("model", sort=False):
        wins, rates = 0, 0
        for _, r in g.groupby("rate_fraction"):
            e = r.loc[r["scheduler"] == "eager_cont_batch", ttft]
            if e.empty or r[ttft].isna().all():
                continue
            rates += 1
            wins += bool(e.iloc[0] <= TTFT_TIE * r[ttft].min())
        top = g[g["rate_fraction"] == g["rate_fraction"].max()]
        e_tp = top.loc[top["scheduler"] == "eager_cont_batch", "delivered_tok_s"]
        best_tp = top.loc[top["delivered_tok_s"].idxmax()]
        # every setting at the highest throughput, by the seed's names: a tie is said as one
        tied = top[top["delivered_tok_s"] == best_tp["delivered_tok_s"]]
        best_names = [seed_setting(x, b) for x, b in zip(tied["scheduler"], tied["budget"], strict=True)]
        ttft_best = rates > 0 and wins >= rates / 2
        tp_best = not e_tp.empty and bool(e_tp.iloc[0] >= THROUGHPUT_TIE * best_tp["delivered_tok_s"])
        if not e_tp.empty:
            shares.append(float(e_tp.iloc[0] / best_tp["delivered_tok_s"]))
            share_of[short(model)] = shares[-1]
        per[short(model)] = "holds" if ttft_best and tp_best else "changes" if ttft_best or tp_best else "fails"
        e_val = f"{e_tp.iloc[0]:,.0f}" if not e_tp.empty else "n/a"
        others = [n for n in best_names if n != SHOWN["eager_cont_batch"]]
        if len(others) < len(best_names):  # EagerContBatch itself has the highest throughput
            against = ", the highest" + (f", tied with {' and '.join(others)}" if others else "")
        else:
            against = f" vs best {best_tp['delivered_tok_s']:,.0f} ({' = '.join(best_names)})"
        parts.append(
            f"{short(model)}: lowest mean TTFT at {wins}/{rates} rates; at the top rate measured, "
            f"{best_tp['rate']:.2f} req/s, throughput {e_val} tok/s{against}"
            + (_censored_text(top) if ttft == COMMON_TTFT else "")
        )
    settings = s["setting"].nunique()
    return _per_model_finding(
        "F1.3",
        per,
        parts,
        rule="EagerContBatch is best if within 5% of the lowest mean TTFT (at half the rates or more) and "
        "within 3% of the highest delivered throughput at the most loaded rate"
        + (
            "; a rate's mean TTFT is over the requests every setting was offered, one with no first token by the "
            "earliest deadline counted at it."
            if ttft == COMMON_TTFT
            else ", mean TTFT over completed requests."
        ),
        seed_value="best mean TTFT and throughput",
        unit="ms, tokens/s",
        tested_on=tested_on(
            s["model"], dtype=dtype, setting=f"{settings} policy settings × {s['rate_fraction'].nunique()} rates"
        ),
        headline=float(np.median(shares)) if shares else None,
        headline_parts=tuple(share_of.items()),
        headline_unit=f"× EagerContBatch's / the best setting's throughput at the top rate measured"
        f"{over_models(len(shares))} (best from 0.97)",
    )


def _missing(fid: str, unit: str, why: str) -> Finding:
    return Finding(
        id=fid,
        claim=CLAIMS[fid],
        seed_value="",
        measured_value="not measured",
        unit=unit,
        verdict="fails",
        note=f"could not be judged: {why}",
    )


def findings(summary: pd.DataFrame, reference_budget: int, dtype: str | None = None) -> list[Finding]:
    """F1.1–F1.3 from the sweep's summary; ``dtype`` (the run's weights and KV dtype) is named in ``tested_on``."""
    return [f11(summary, reference_budget, dtype), f12(summary, reference_budget, dtype), f13(summary, dtype)]
