"""The verdict rules of the 22 claims, registered in one file (``data/rules.yml``) with their dates, and the rule
changes made after a claim's first H200 measurement.

Each claim's entry holds its rule's text as registered (``registered``: the date and commit that introduced it) and,
for every later change, an entry with the old and the new rule, why, and the name of a function here that applies
the *old* rule to today's committed H200 data. The texts are chained by hash: ``registered_hash`` is the hash of the
rule as first registered; each change's ``old_rule`` must hash to the rule before it; the current ``rule`` must be
the last change's ``new_rule``. Editing a rule's text without adding a change entry breaks the chain, and
``check_registry`` (run by the tests) says which claim.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from servelab.paths import DATA_DIR

if TYPE_CHECKING:
    from servelab.studies.common.runs import RunSet

REGISTRY = DATA_DIR / "rules.yml"
CLAIM_IDS = tuple(
    f"F{s}.{k}" for s, n in ((1, 3), (2, 3), (3, 3), (4, 4), (5, 3), (6, 2), (7, 4)) for k in range(1, n + 1)
)


def rule_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of a rule's text, whitespace normalised (rewrapping is no change)."""
    return hashlib.sha256(" ".join(str(text).split()).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RuleChange:
    date: str  # YYYY-MM-DD of the commit that changed the rule
    commit: str
    old_rule: str
    new_rule: str
    why: str
    old_verdict: str  # the name of a function in OLD_RULES that applies old_rule to today's data


@dataclass(frozen=True)
class Rule:
    id: str
    study: str  # the results folder: 01_scheduling …
    rule: str  # the rule in force
    registered: str  # YYYY-MM-DD the rule was first registered (committed)
    registered_commit: str
    registered_hash: str  # rule_hash of the rule's text as first registered
    implemented_in: str  # the module that computes it
    first_h200: str = ""  # the commit of the claim's first H200 measurement
    changes: tuple[RuleChange, ...] = field(default_factory=tuple)


def load_registry(path: Path = REGISTRY) -> dict[str, Rule]:
    """The registry by claim id, in claim order."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    rules = {}
    for entry in data["rules"]:
        changes = tuple(RuleChange(**{k: str(v) for k, v in c.items()}) for c in entry.pop("changes", None) or [])
        rules[entry["id"]] = Rule(**{k: str(v) for k, v in entry.items()}, changes=changes)
    return rules


def check_registry(rules: dict[str, Rule]) -> list[str]:
    """Every problem with the registry: a claim missing or unknown, a broken hash chain (a rule changed without a
    change entry), a change whose old verdict cannot be computed. Empty when it is sound."""
    problems = [f"{c}: no rule registered" for c in CLAIM_IDS if c not in rules]
    problems += [f"{c}: not one of the seed's claims" for c in rules if c not in CLAIM_IDS]
    for r in rules.values():
        expected = r.registered_hash
        for i, ch in enumerate(r.changes):
            if rule_hash(ch.old_rule) != expected:
                problems.append(f"{r.id}: change {i + 1} ({ch.date})'s old rule is not the rule before it")
            if ch.old_verdict not in OLD_RULES:
                problems.append(f"{r.id}: change {i + 1}'s old_verdict {ch.old_verdict!r} is not in OLD_RULES")
            if ch.date < r.registered:
                problems.append(f"{r.id}: change {i + 1} ({ch.date}) predates the registration ({r.registered})")
            expected = rule_hash(ch.new_rule)
        if rule_hash(r.rule) != expected:
            problems.append(
                f"{r.id}: its rule's text changed without a rule-change entry (hash {rule_hash(r.rule)}, the "
                f"registered chain ends at {expected}): add a change with the old rule, the new one and why"
            )
    return problems


# ---- the old rules, each applied to one repeat of today's committed H200 runs ----------------------------------


@dataclass(frozen=True)
class OldVerdict:
    verdict: str
    detail: str  # the numbers the old rule decided on


def _table(rep: RunSet, name: str):
    """``<name>.csv`` of one repeat (its parts concatenated); KeyError where no run of it wrote one."""
    df = rep.table(name)
    if df.empty and not len(df.columns):
        raise KeyError(f"no {name}.csv in the runs")
    return df


def old_verdict(rule: Rule, change: RuleChange, runs: RunSet) -> OldVerdict:
    """What ``change.old_rule`` says on ``runs`` (the study's committed runs, ``common.runs.study_runs``): the old
    rule applied to each repeat's data, combined over the repeats as today's rules are (``common.runs.combine``:
    inconclusive where they disagree or where fewer than ``MIN_REPEATS`` exist). Nothing measured: inconclusive."""
    from servelab.studies.common.repeats import MIN_REPEATS

    if not runs.measured:
        return OldVerdict("inconclusive", "not measured: no run of this study on the book's device")
    fn = OLD_RULES[change.old_verdict]
    needs = _needs(rule)
    each = [fn(rep) for rep in runs.per_repeat() if rep.has_parts(needs)]
    if not each:  # the study is still measured part by part: no repeat holds what the rule reads
        waits = ", ".join(p for p in needs if p not in runs.parts) or "all of its parts in one repeat"
        return OldVerdict("inconclusive", f"not measured: it waits for {waits} (make gpu-plan lists the jobs)")
    said = [v.verdict for v in each]
    detail = " | ".join(v.detail for v in each)
    if len(set(said)) > 1:
        return OldVerdict("inconclusive", f"the repeats disagree ({', '.join(said)}): {detail}")
    if len(each) < MIN_REPEATS:
        n = len(each)
        return OldVerdict(
            "inconclusive",
            f"{detail}; the old rule says {said[0]} on {n} repeat{'s' if n != 1 else ''}, "
            f"a verdict needs {MIN_REPEATS}",
        )
    return OldVerdict(said[0], detail)


def _needs(rule: Rule) -> tuple[str, ...]:
    """The parts a repeat must hold for the claim's rule to read it: the study report's ``NEEDS`` (as
    ``RunSet.combined`` takes them), none where it declares none."""
    import importlib

    from servelab.studies.common.runs import measuring_module

    report = importlib.import_module(measuring_module(rule.study).rsplit(".", 1)[0] + ".report")
    return tuple(getattr(report, "NEEDS", {}).get(rule.id, ()))


def _register(fn: Callable[[RunSet], OldVerdict]) -> Callable[[RunSet], OldVerdict]:
    OLD_RULES[fn.__name__] = fn
    return fn


OLD_RULES: dict[str, Callable[[RunSet], OldVerdict]] = {}


def _combine(per_model: dict[str, str]) -> str:
    """Study 1's combination over model sizes: one verdict everywhere is the verdict, else "changes"."""
    return next(iter(set(per_model.values()))) if len(set(per_model.values())) == 1 else "changes"


def _study1_summary(rep: RunSet):
    """Study 1's per-point summary: the legacy run's ``summary.csv`` as it was written then; a run of the parts
    layout keeps raw tables only, so its summary is computed as the page computes it."""
    try:
        return _table(rep, "summary")
    except KeyError:
        from servelab.studies.s01_scheduling.summary import repeat_summary

        return repeat_summary(rep)


def _study1_pairs_unfiltered(rep: RunSet):
    """Study 1's pairing before 4296c78: every ok rate-sweep rate measured with both policies, served or not."""

    budget = rep.params["reference_budget"]
    s = _study1_summary(rep)
    s = s[(s["status"] == "ok") & (s["sweep"] == "rate")]
    cols = ["max_itl_ms", "delivered_tok_s"]
    e = s[s["scheduler"] == "eager_cont_batch"].set_index(["model", "rate_fraction"])[cols]
    c = s[(s["scheduler"] == "chunked_prefill") & (s["budget"] == budget)].set_index(["model", "rate_fraction"])[cols]
    j = e.join(c, lsuffix="_eager", rsuffix="_chunked", how="inner").reset_index()
    j["stall_cut"] = 1 - j["max_itl_ms_chunked"] / j["max_itl_ms_eager"]
    j["throughput_ratio"] = j["delivered_tok_s_chunked"] / j["delivered_tok_s_eager"]
    return j


@_register
def f11_before_served_pairs(rep: RunSet) -> OldVerdict:
    """F1.1 before runs past capacity were left out: median cut over every paired rate; 20–70% holds, ≤ 5% fails."""
    per, parts = {}, []
    for model, g in _study1_pairs_unfiltered(rep).groupby("model", sort=False):
        cut = float(g["stall_cut"].median())  # NaN where a stall is unknown: the old rule's own defect
        name = model.split(":")[-1]
        per[name] = "fails" if not cut > 0.05 else "holds" if 0.20 <= cut <= 0.70 else "changes"
        parts.append(f"{name}: median cut {cut:.0%} over {len(g)} rates")
    return OldVerdict(_combine(per), "; ".join(parts))


@_register
def f12_before_served_pairs(rep: RunSet) -> OldVerdict:
    """F1.2 before runs past capacity were left out: the throughput ratio at the most loaded paired rate."""
    per, parts = {}, []
    for model, g in _study1_pairs_unfiltered(rep).groupby("model", sort=False):
        cut = float(g["stall_cut"].median())
        ratio = float(g.loc[g["rate_fraction"].idxmax(), "throughput_ratio"])
        name = model.split(":")[-1]
        per[name] = "fails" if not cut > 0.05 else "changes" if ratio > 1.10 else "holds"
        parts.append(f"{name}: stall cut {cut:.0%}, throughput ×{ratio:.2f} at the top rate")
    return OldVerdict(_combine(per), "; ".join(parts))


@_register
def f22_hf_eager_only(rep: RunSet) -> OldVerdict:
    """F2.2 before 5614c7c: flat and bandwidth-bound judged on HF eager alone (≤ 10% variation over context per
    model; median share of the floor ≥ 20% per model), µs/token against 5,300–10,800."""

    d = _table(rep, "steps")
    d = d[(d["status"] == "ok") & (d["phase"] == "decode") & (d["mode"] == "hf_eager") & (d["batch"] == 1)]
    by = d.groupby("model")
    variation = (by["median_ms"].max() / by["median_ms"].min() - 1) * 100
    pct = by["pct_of_floor"].median()
    flat, bound = bool((variation <= 10.0).all()), bool((pct >= 20.0).all())
    in_band = d["us_per_token"].max() >= 5300.0 and d["us_per_token"].min() <= 10800.0
    verdict = ("holds" if in_band else "changes") if bound and flat else ("fails" if not bound else "changes")
    detail = f"HF eager: variation up to {variation.max():.0f}%, {pct.min():.1f}–{pct.max():.1f}% of the memory floor"
    return OldVerdict(verdict, detail)


@_register
def f23_any_context(rep: RunSet) -> OldVerdict:
    """F2.3 before 5614c7c: decode at any context; the verdict rests on the prefill ratio RTX 2070 / H200 (0.5–2×)."""

    d = _table(rep, "steps")
    pre = d[(d["status"] == "ok") & (d["phase"] == "prefill") & (d["batch"] == 1) & (d["new_tokens"] >= 4096)]
    pre = pre[pre["mode"] == pre.groupby("mode")["us_per_token"].median().idxmin()]["us_per_token"]
    ratio = 50.0 / float(pre.median())
    return OldVerdict("holds" if 0.5 <= ratio <= 2.0 else "changes", f"RTX 2070 prefill / H200's: {ratio:.0f}×")


@_register
def f42_max_min_variation(rep: RunSet) -> OldVerdict:
    """F4.2 before 43da3c2/4d96cb4: flat means max/min variation ≤ 10% over the contexts (not the fitted trend)."""

    try:
        s = _table(rep, "decode_variation")  # written by runs before the measure/report split
    except KeyError:  # since then derived at render time from the raw decode steps, as Study 4's report does
        from servelab.studies.s04_kv_cache.derived import variation_summary

        s = variation_summary(_table(rep, "decode_steps"))
    flat = s["variation_pct"] <= 10.0
    near = s["pct_of_floor_at_max_context"] >= 50.0
    if not flat.any():
        verdict = "fails"
    elif flat.all() and (near & flat).any():
        verdict = "holds"
    else:
        verdict = "changes"
    return OldVerdict(verdict, f"flat (≤ 10% max/min) in {int(flat.sum())} of {len(s)} regimes")


@_register
def f62_pairs_table_only(rep: RunSet) -> OldVerdict:
    """F6.2 before bbf264c: ρ(cost ratio, speedup) over every row of the pair table, and each pair's speedup
    against output length over all its lengths (not only the prompts that reached the longest)."""
    import pandas as pd
    from scipy import stats

    d = _study6_measured(rep)
    rho_c = float(stats.spearmanr(d["cost_ratio"], d["speedup_median"]).statistic)
    per_pair = []
    for _, g in d.groupby("pair"):
        g = g.sort_values("length")
        if len(g) >= 3:
            rho = stats.spearmanr(g["length"], g["speedup_median"]).statistic
            change = g["speedup_median"].iloc[-1] / g["speedup_median"].iloc[0] - 1
            per_pair.append((0.0 if math.isnan(rho) else float(rho), float(change)))
    rho_len = float(pd.Series([r for r, _ in per_pair]).median())
    change = float(pd.Series([c for _, c in per_pair]).median())
    c_decides, len_decides = rho_c <= -0.5, rho_len >= 0.5 and change >= 0.05
    verdict = "holds" if c_decides and len_decides else "changes" if c_decides or len_decides else "fails"
    return OldVerdict(
        verdict, f"ρ_c = {rho_c:+.2f} over {len(d)} rows; ρ_length = {rho_len:+.2f}, change {change:+.0%}"
    )


def _study6_measured(rep: RunSet):
    """Study 6's pair × length table with a measured speedup, over any number of prompts (before acd6608): as the
    runs of that time wrote it (``pairs.csv``), else derived from today's raw tables as today's report derives it
    (runs since the SmolLM2 move keep only the raw per-prompt times)."""
    try:
        d = _table(rep, "pairs")
    except KeyError:
        from servelab.studies.s06_hf_assisted.report import derive

        d = derive(rep).pairs
        if d.empty:
            raise
    return d.dropna(subset=["speedup_median"])


@_register
def f61_any_prompt_count(rep: RunSet) -> OldVerdict:
    """F6.1 before acd6608: the best pair's median speedup at the longest length any pair ran to, whatever the
    number of prompts behind it; nothing measured fails."""
    d = _study6_measured(rep)
    if d.empty:
        return OldVerdict("fails", "no assisted run completed")
    length = int(d["length"].max())
    best = d[d["length"] == length].sort_values("speedup_median").iloc[-1]
    s = float(best["speedup_median"])
    verdict = "fails" if s <= 1.0 else "holds" if abs(s / 1.747 - 1) <= 0.20 else "changes"
    return OldVerdict(
        verdict, f"best pair {best['pair']} at {length} tokens: {s:.2f}× over {int(best['prompts'])} prompt(s)"
    )


def _spearman_or_nan(x, y) -> float:
    import numpy as np
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(stats.spearmanr(x[ok], y[ok]).statistic)


def _study6_length_trends(rep: RunSet) -> list[tuple[float, float]]:
    """(ρ, change) of speedup against output length per assisted pair with ≥ 3 lengths, on the prompts that reached
    the pair's longest length (per-prompt speedups: plain ms / assisted ms on the same target, prompt, length)."""

    t = _table(rep, "times")
    base = t[t["method"] == "plain"][["prompt", "target", "length", "ms"]].rename(columns={"ms": "base_ms"})
    d = t[t["method"] == "assisted"].merge(base, on=["prompt", "target", "length"], how="inner")
    d = d.assign(speedup=d["base_ms"] / d["ms"]).dropna(subset=["speedup"])
    out = []
    for _, g in d.groupby("pair"):
        full = g[g["prompt"].isin(g.loc[g["length"] == g["length"].max(), "prompt"])]
        med = full.groupby("length")["speedup"].median().sort_index()
        if len(med) >= 3:
            rho = _spearman_or_nan(med.index, med.values)
            out.append((0.0 if math.isnan(rho) else rho, float(med.iloc[-1] / med.iloc[0] - 1)))
    return out


@_register
def f62_any_prompt_count(rep: RunSet) -> OldVerdict:
    """F6.2 between bbf264c and acd6608: ρ(c, speedup) across pairs at the longest length at which ≥ 3 pairs ran,
    and each pair's length trend on the prompts that reached its longest, whatever the number of prompts behind a
    (pair, length) speedup; too few pairs or lengths fails."""
    import statistics

    d = _study6_measured(rep)
    n = d.groupby("length")["pair"].nunique()
    lengths = n[n >= 3].index
    trends = _study6_length_trends(rep)
    if not len(lengths) or not trends:
        return OldVerdict("fails", f"needs ≥ 3 pairs at one length and ≥ 3 lengths; got {d['pair'].nunique()} pairs")
    at = d[d["length"] == int(lengths.max())]
    rho_c = _spearman_or_nan(at["cost_ratio"], at["speedup_median"])
    rho_len = float(statistics.median(r for r, _ in trends))
    change = float(statistics.median(c for _, c in trends))
    c_decides, len_decides = rho_c <= -0.5, rho_len >= 0.5 and change >= 0.05
    verdict = "holds" if c_decides and len_decides else "changes" if c_decides or len_decides else "fails"
    lo, hi = int(at["prompts"].min()), int(at["prompts"].max())
    prompts = f"{lo}" if lo == hi else f"{lo}–{hi}"
    return OldVerdict(
        verdict,
        f"ρ_c = {rho_c:+.2f} over {len(at)} pairs at {int(lengths.max())} tokens ({prompts} prompt(s) per pair); "
        f"ρ_length = {rho_len:+.2f}, change {change:+.0%} ({len(trends)} pairs)",
    )


def _study1_served_max_pairs(rep: RunSet):
    """Study 1's served pairs (a measured stall, at most half the requests cut) with the cut in each run's single
    maximum inter-token gap (``max_cut``) and the throughput ratio ChunkedPrefill / EagerContBatch (``ratio``), by
    (model, rate_fraction): the pairing of 4296c78 before the p99 of per-request maximum ITL."""

    budget = rep.params["reference_budget"]
    s = _study1_summary(rep)
    s = s[(s["status"] == "ok") & (s["sweep"] == "rate") & s["max_itl_ms"].notna() & (s["cut"] <= 0.5 * s["requests"])]
    key, cols = ["model", "rate_fraction"], ["max_itl_ms", "delivered_tok_s"]
    e = s[s["scheduler"] == "eager_cont_batch"].set_index(key)[cols]
    c = s[(s["scheduler"] == "chunked_prefill") & (s["budget"] == budget)].set_index(key)[cols]
    j = e.join(c, lsuffix="_eager", rsuffix="_chunked", how="inner")
    j["max_cut"] = 1 - j["max_itl_ms_chunked"] / j["max_itl_ms_eager"]
    j["ratio"] = j["delivered_tok_s_chunked"] / j["delivered_tok_s_eager"]
    return j.dropna(subset=["max_cut"])


@_register
def f11_single_max(rep: RunSet) -> OldVerdict:
    """F1.1 before the p99 of per-request maximum ITL: the cut in each run's single maximum inter-token gap over the
    served pairs (a measured stall, at most half the requests cut), median over rates; 20–70% holds, ≤ 5% fails."""
    per, parts = {}, []
    for model, g in _study1_served_max_pairs(rep)["max_cut"].groupby(level="model", sort=False):
        m = float(g.median())
        name = model.split(":")[-1]
        per[name] = "fails" if not m > 0.05 else "holds" if 0.20 <= m <= 0.70 else "changes"
        parts.append(f"{name}: median cut in the maximum {m:.2%} over {len(g)} rates")
    return OldVerdict(_combine(per), "; ".join(parts))


@_register
def f12_single_max(rep: RunSet) -> OldVerdict:
    """F1.2 before its stall-cut gate read the p99 of per-request maximum ITL: the gate on the cut in each run's
    single maximum gap (median over the served pairs' rates, > 5%), the throughput ratio at the most loaded served
    rate (> 1.10 changes)."""
    per, parts = {}, []
    for model, g in _study1_served_max_pairs(rep).groupby(level="model", sort=False):
        cut = float(g["max_cut"].median())
        ratio = float(g["ratio"].iloc[g.index.get_level_values("rate_fraction").argmax()])
        name = model.split(":")[-1]
        per[name] = "fails" if not cut > 0.05 else "changes" if ratio > 1.10 else "holds"
        parts.append(f"{name}: cut in the maximum {cut:.0%}, throughput ×{ratio:.2f} at the top served rate")
    return OldVerdict(_combine(per), "; ".join(parts))


@_register
def f33_any_mode_above_eager(rep: RunSet) -> OldVerdict:
    """F3.3 as its registered text reads: eager HF's target/draft step-time ratio far below the parameter ratio
    (under half) "while another mode reaches further", read literally as any other mode's ratio above eager HF's,
    with no bar; the code has asked ``FURTHER`` × the eager ratio since the rule's registration (d506ce2)."""
    from servelab.studies.s03_speculative.report import cost_ratio_table, shape_pair
    from servelab.studies.s03_speculative.verdicts import FAR_BELOW

    draft, target = shape_pair(rep)
    r = cost_ratio_table(rep)
    r = r[(r["draft"] == draft) & (r["target"] == target)].set_index("mode")
    if "hf_eager" not in r.index:
        return OldVerdict("inconclusive", "no eager HF ratio for the Qwen2 shapes")
    eager, param = float(r.loc["hf_eager", "target_over_draft"]), float(r["param_ratio"].iloc[0])
    others = r.drop(index="hf_eager")["target_over_draft"]
    best = float(others.max()) if len(others) else float("nan")
    far, further = eager < FAR_BELOW * param, bool(best > eager)
    return OldVerdict(
        "holds" if far and further else "changes",
        f"eager {eager:.2f}× against parameters {param:.2f}× ({'far below' if far else 'not far below'}); the best "
        f"other mode {best:.2f}× ({'above' if further else 'not above'} eager's)",
    )


@_register
def f13_completed_requests_only(rep: RunSet) -> OldVerdict:
    """F1.3 before 2026-12-07: each setting's mean TTFT over its own completed requests, so a setting that cut its
    slowest requests at the deadline (FCFS past capacity) averaged only the ones it served; the same 5% and 3% ties."""
    from servelab.studies.s01_scheduling.verdicts import COMPLETED_TTFT, f13

    found = f13(_study1_summary(rep), rep.params.get("dtype"), ttft=COMPLETED_TTFT)
    return OldVerdict(found.verdict, found.measured_value)
