"""The simulator page's sentences, generated from a run (``page.Run``): every number comes from its tables.

Each function returns markdown (an empty string where the run has no data for it); ``headline`` gives the three to
five sentences at the top of the page, the others the takeaway of their section.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.markdown import format_value
from servelab.studies.common.page import takeaway_list
from servelab.studies.common.repeats import MIN_REPEATS
from servelab.studies.common.tested_on import model_name
from servelab.studies.s08_simulator import context_reads as cr
from servelab.studies.s08_simulator.plots import GOAL_PCT, ROUTER_WORDS
from servelab.studies.s08_simulator.source_words import gpu_source_words
from servelab.studies.s08_simulator.verdicts import median_abs_error

__all__ = ["takeaway_list", "headline"]


def router_words(name: str) -> str:
    """A router as the page's prose, tables and legends name it (``plots.ROUTER_WORDS``)."""
    return ROUTER_WORDS.get(name, name)


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _box(title: str, text: str, kind: str = "tip") -> str:
    """A takeaway admonition (MyST), as ``servelab_book.takeaway`` renders one; ``kind`` "warning" for one that
    reports a missed goal (a green box read as a goal met)."""
    return f":::{{admonition}} {title}\n:class: {kind}\n{text.strip()}\n:::\n" if text else ""


# ---- the top of the page -------------------------------------------------------------------------------------
def headline(r) -> str:
    return takeaway_list(
        [_fidelity_short(r), _study7_short(r), _capacity_text(r), _affinity_text(r, short=True), _speed_text(r)]
    )


def _study2_rows(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of the models whose GPU costs are Study 2's, the ones F2.3 is about."""
    return t[t["gpu_source"] == "Study 2"] if "gpu_source" in t.columns else t


def _models(t: pd.DataFrame) -> str:
    return ", ".join(sorted(model_name(m) for m in t["model"].unique()))


def _fidelity_short(r) -> str:
    t = r["sim_validation"].dropna(subset=["error_pct"])
    if t.empty:
        return ""
    own, where = _study2_rows(t), f"Replaying {r.source}" + (f" ({r.s1_repeat})" if r.s1_repeat else "")
    if own.empty:
        own = t
    rest = t.drop(own.index)
    text = (
        f"{where}, the simulator's median |error| over six serving metrics of the held-out runs of {_models(own)}"
        + (", whose GPU costs are Study 2's," if len(rest) else "")
        + f" is {median_abs_error(own, 'gpu_only'):.1f} % with the GPU cost model alone and "
        f"{median_abs_error(own, 'gpu+overheads'):.1f} % with the fitted serving overheads (goal ≤ {GOAL_PCT:g} %)"
    )
    if len(rest):
        # pooled, a model whose GPU model was fitted to the server's own step log made the simulator look near goal
        text += (
            f"; pooled with {_models(rest)}, whose GPU cost model is fitted to Study 1's own step log, "
            f"{median_abs_error(t, 'gpu_only'):.1f} % and {median_abs_error(t, 'gpu+overheads'):.1f} %"
        )
    return text + "."


def _study7_short(r) -> str:
    if r.study7 is None:
        return ""
    t = r["sim_prefix_validation"]
    g = t[t["cost_model"] == "gpu+overheads"]["error_pct"].abs()
    return (
        f"Against Study 7's server runs with prefix caching, which nothing was fitted to, the median |error| over "
        f"{len(g)} numbers is {g.median():.1f} %."
    )


# ---- real against simulated -----------------------------------------------------------------------------------
def _fidelity_line(t: pd.DataFrame, gsrc: str) -> str:
    before, after = median_abs_error(t, "gpu_only"), median_abs_error(t, "gpu+overheads")
    v = t[t["cost_model"] == "gpu+overheads"]
    v = v[v["subset"] == "validation"] if (v["subset"] == "validation").any() else v
    per_metric = v.assign(abs_err=v["error_pct"].abs()).groupby("metric")["abs_err"].median().sort_values()
    models = ", ".join(sorted(model_name(m) for m in t["model"].unique()))
    source = gsrc if gsrc == "Study 2" else "the " + gsrc
    return (
        f"- {models} (GPU terms from {source}): median |error| **{before:.1f} %** with the GPU cost model alone, "
        f"**{after:.1f} %** with the fitted serving terms; best metric {per_metric.index[0]} "
        f"({per_metric.iloc[0]:.1f} %), worst {per_metric.index[-1]} ({per_metric.iloc[-1]:.1f} %)."
    )


def fidelity(r) -> str:
    t = r["sim_validation"].dropna(subset=["error_pct"])
    lines = [_fidelity_line(g, gsrc) for gsrc, g in t.groupby("gpu_source")]
    if not lines:
        return "No run could be replayed (see the calibration table's status column): no fidelity figure."
    missed = median_abs_error(_study2_rows(t), "gpu+overheads") > GOAL_PCT
    runs = f"{r.s1_repeat}'s held-out runs" if r.s1_repeat else "held-out runs"
    title = f"Simulator fidelity ({runs}, six metrics; goal ≤ {GOAL_PCT:g} %)"
    return _box(title, "\n".join(lines) + "\n\n" + _f23_words(r), "warning" if missed else "tip")


def _f23_words(r) -> str:
    """What F2.3 reads of this: the repeats it is judged on, its value over them, and why too few where so: whether the
    parts a left-out repeat lacks are any F2.3 reads, and, where not, what that repeat's own runs say (not part of the
    verdict)."""
    from servelab.studies.s08_simulator.report import _others_only, f23_error_words, f23_value, lacks_words

    f = r.f23
    if f is None:
        return "No model with Study 2 costs was replayed: no F2.3 evidence."
    if f.repeats <= 1:
        return f"For F2.3 (Study 2's costs) this says **{f.verdict}**."
    text = (
        f"F2.3 (Study 2's costs) is judged on each of Study 1's repeats with every part, and reads "
        f"{f23_value(f)} % ({f23_error_words(f)}): **{f.verdict}**"
    )
    if f.verdict == "inconclusive" and f.repeats < MIN_REPEATS and r.s1_partial:
        text += f", as a verdict needs {MIN_REPEATS} repeats and Study 1's {lacks_words(r.s1_partial)}"
        if _others_only(r):
            models = ", ".join(r.f23_models)
            text += (
                f", runs F2.3 does not read: it reads {models}'s alone, and the simulator leaves the repeat out only "
                "because it takes Study 1's repeats whole"
            )
            text += "".join(
                f". Read on its own, {name}'s {models} runs give {value:.1f} % ({verdict}); that is not part of the "
                "verdict"
                for name, (value, verdict) in r.s1_readings.items()
            )
    return text + "."


# ---- the two GPU terms -----------------------------------------------------------------------------------------
def _by(r, value: str) -> pd.DataFrame:
    """One ablation value per variant (rows) and model (columns, as the reader knows them; "all" for every model)."""
    t = r["sim_term_ablation"].pivot_table(index="variant", columns="model", values=value, sort=False)
    return t.rename(columns=model_name)


def ablation_table(r) -> pd.DataFrame:
    """Held-out median |error| and the calibration steps' median |error| of each variant, per model."""
    return pd.concat(
        {
            "held-out runs, median |error| %": _by(r, "median_abs_error_pct"),
            "calibration steps, median |error| %": _by(r, "step_median_abs_pct"),
        },
        axis=1,
    )


def ablation(r) -> str:
    by_variant, by_step = _by(r, "median_abs_error_pct"), _by(r, "step_median_abs_pct")
    if "all" not in by_variant.columns or not {"neither", "both"} <= set(by_variant.index):
        return ""
    per_model = "; ".join(
        f"{m} {by_variant.loc['neither', m]:.1f} → {by_variant.loc['both', m]:.1f} %" for m in by_variant if m != "all"
    )
    best = by_variant["all"].idxmin()
    text = (
        f"Held-out median |error| without the padding and the context reads "
        f"**{by_variant.loc['neither', 'all']:.1f} %**, with both **{by_variant.loc['both', 'all']:.1f} %** "
        f"({per_model}) on {r.source}. Step by step, on the calibration runs' step log: "
        f"{by_step.loc['neither', 'all']:.1f} % → {by_step.loc['both', 'all']:.1f} %."
    )
    if best != "both":
        text += (
            f" The lowest held-out error is that of '{best}' ({by_variant.loc[best, 'all']:.1f} %); the simulator "
            "keeps both terms, which the step log supports, and the difference between the two is within what the "
            "choice of held-out runs moves."
        )
    if r.study1:
        text += (
            " The check against Study 7 below, where prompts are long and read long cached prefixes, tests them "
            "where they matter most" + _study7_terms(r.table("sim_prefill_check"))
        )
    return _box("The two GPU terms, before and after", text)


def _step_errors(check: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """Study 7's single prompts: the median |error| of the step times per cost model (first: without the two GPU
    terms), and per cost model (rows) and prompt (columns)."""
    e = check.assign(a=check["error_pct"].abs())
    return e.groupby("cost_model", sort=False)["a"].median(), e.pivot_table(
        index="cost_model", columns="mode", values="a", aggfunc="median", sort=False
    )


def _study7_terms(check) -> str:
    """What Study 7's single prompts say of the two GPU terms, and why the simulator keeps them either way."""
    if check is None or not len(check) or check["cost_model"].nunique() <= 1:
        return "."
    overall, by_mode = _step_errors(check)
    without, with_ = overall.iloc[0], overall.iloc[-1]
    each = "; ".join(f"{m} {by_mode.iloc[0][m]:.1f} → {by_mode.iloc[-1][m]:.1f} %" for m in by_mode.columns)
    said = "there they make the step times worse" if with_ > without else "there they bring the step times closer"
    return (
        f"; {said}: a median |error| of {without:.1f} % without them, {with_:.1f} % with them ({each}). The "
        "simulator keeps both all the same: they were chosen on Study 1's step log and Study 2's steps and are frozen "
        "with the cost model, and a check nothing was fitted to can test that choice but not make it (chosen on "
        "it, the terms would be fitted to it)."
    )


# ---- the context reads -----------------------------------------------------------------------------------------
def _mixed_note(excess: pd.DataFrame, cost) -> str:
    bins = cr.excess_by_context(excess) if len(excess) else pd.DataFrame()
    if len(bins) <= 1:
        return ""
    lo, hi = bins.iloc[0], bins.iloc[-1]
    return (
        f"mixed steps of Study 1's server ({len(excess):,}): the median excess is {lo.q50:.1f} ms at a longest "
        f"context of {lo.longest_context:,.0f} tokens and {hi.q50:.1f} ms at {hi.longest_context:,.0f}, where the "
        f"model charges {lo.priced_ms:.1f} and {hi.priced_ms:.1f} ms (its mixed-step cost {cost.mixed_step_ms:.2f} ms "
        f"plus {cost.ms_per_longest_context_token * cost.prefill_scale * 1e3:.2f} µs per token of the longest "
        f"context: the {cost.ms_per_longest_context_token * 1e3:.3f} µs per cached token fitted on Study 2's steps, "
        f"times the server's fitted prefill scale, {cost.prefill_scale:.2f})"
    )


def _decode_note(decode: pd.DataFrame) -> str:
    if not len(decode):
        return ""
    e = {
        k: (100 * (decode[k] - decode["measured_ms"]).abs() / decode["measured_ms"]).median()
        for k in ("before_ms", "after_ms")
    }
    return (
        f"Study 2's {len(decode)} decode steps: median |error| {e['before_ms']:.1f} % with its decode fit, "
        f"{e['after_ms']:.1f} % with the longest sequence priced"
    )


def context_reads(r) -> str:
    c = r.context
    notes = [n for n in (_mixed_note(c["excess"], c["cost"]), _decode_note(c["decode"])) if n]
    return _box("The longest walk over cached keys", "; ".join(notes) + ".") if notes else ""


# ---- Study 7's server ------------------------------------------------------------------------------------------
def study7_setup(r) -> str:
    from servelab.studies.s08_simulator.study7_runs import engine_in_process

    s7 = r.study7
    where = (
        "in the notebook's process, beside the HTTP server"
        if engine_in_process(s7.params)
        else "in a process of its own"
    )
    # the server's limits and the single prompts' sizes come from the run's own parameters, so the prose follows
    # whatever Study 7 ran with rather than its defaults at the time of writing
    p = s7.params
    budget = p.get("max_num_batched_tokens")
    prefixes, suffix = p.get("prefix_lengths") or [], p.get("suffix_tokens")
    sizes = (
        f" Its single prompts: the whole prompt computed (caching off) or a {suffix:,}-token suffix after a cached "
        f"prefix (caching on), at prefixes of {min(prefixes):,} to {max(prefixes):,} tokens."
        if prefixes and suffix
        else ""
    )
    return (
        f"Study 7's {r.s7_repeat} (the first whose server runs all completed), run at "
        f"{s7.commit or 'an unrecorded commit'}: the engine {where}; "
        + (f"a step budget of {budget:,} tokens; " if budget else "")
        + f"{len(s7.summary)} server runs.{sizes}"
    )


def _unit(metric: str) -> str:
    return "tokens/s" if metric == "throughput" else "ms"


def _miss(g: pd.DataFrame, sens: pd.DataFrame, load: str, caching: str, err: float) -> str:
    """One server run the simulator missed by more than 20 %: its two worst numbers and the step-cost sensitivity."""
    w = g[(g["load"] == load) & (g["caching"] == caching)].set_index("metric")
    s = sens[(sens["load"] == load) & (sens["caching"] == caching)].set_index("step_cost_factor")
    worst = w["abs_err"].nlargest(2).index
    return (
        f"{load} with caching {caching} ({err:.0f} %; its prompts fill {s.loc[1.0, 'prefill_share']:.0%} of the "
        "simulated run): "
        + ", ".join(
            f"{m} {w.loc[m, 'real']:,.0f} {_unit(m)} real against {w.loc[m, 'sim']:,.0f} simulated" for m in worst
        )
        + f"; with every step 10 % cheaper or dearer the simulated p50 TTFT is {s.loc[0.9, 'ttft_p50_ms']:.0f}–"
        f"{s.loc[1.1, 'ttft_p50_ms']:.0f} ms and p50 ITL {s.loc[0.9, 'itl_p50_ms']:.1f}–"
        f"{s.loc[1.1, 'itl_p50_ms']:.1f} ms"
    )


def _burst_note(r) -> str:
    first = r.table("sim_prefix_first_tokens")
    if first is None:
        return ""
    b0 = first[(first["load"] == "burst") & (first["quantile"] == 0.0)]
    if not len(b0):
        return ""
    gap = b0["real_ms"] - b0["sim_ms"]
    text = (
        "Earliest first token of the burst, real against simulated: "
        + ", ".join(f"caching {x.caching} {x.real_ms:.0f} against {x.sim_ms:.0f} ms" for x in b0.itertuples())
        + ". "
    )
    if gap.min() > 100:
        text += (
            f"Even the first request of a burst waited {gap.min():.0f}–{gap.max():.0f} ms longer than simulated: a "
            "delay before the engine's first step, which no step cost explains; the simulator has only a fixed "
            f"ingress delay per request ({r.s7_cost['gpu+overheads'].ingress_ms:.1f} ms), no queue for a few hundred "
            "requests sent at once. "
        )
    return text


def _steps_note(check: pd.DataFrame) -> str:
    if not len(check) or check["cost_model"].nunique() <= 1:
        return ""
    e = _step_errors(check)[0]
    worse = (
        " (the two terms make these steps worse: see what each GPU term buys, above)" if e.iloc[-1] > e.iloc[0] else ""
    )
    return (
        f"Study 7's single prompts, step by step: median |error| {e.iloc[0]:.1f} % without the padding and "
        f"context-read terms, {e.iloc[-1]:.1f} % with them{worse}. "
    )


def study7(r) -> str:
    table, sens = r["sim_prefix_validation"], r["sim_prefix_sensitivity"]
    g = table[table["cost_model"] == "gpu+overheads"].assign(abs_err=lambda d: d["error_pct"].abs())
    per_run = g.groupby(["load", "caching"], sort=False)["abs_err"].median()
    hits = g[g["caching"] == "on"].groupby("load", sort=False)[["hit_rate_real", "hit_rate_sim"]].first()
    misses = [_miss(g, sens, load, caching, err) for (load, caching), err in per_run.items() if err > 20]
    sp = r["sim_prefix_speedups"]
    sp = sp[sp["cost_model"] == "gpu+overheads"].set_index(["load", "metric"])
    gpu_only = table[table["cost_model"] == "gpu_only"]["error_pct"].abs().median()
    text = (
        _steps_note(r["sim_prefill_check"])
        + f"Server runs of Study 7's {r.s7_repeat} (every real value here is that repeat's; Study 7's page gives "
        f"medians over its repeats): median |error| over the {len(g)} numbers: **{g['abs_err'].median():.1f} %** "
        f"(GPU costs alone: {gpu_only:.1f} %). The cache itself is right: hit rate, real → simulated, "
        + ", ".join(f"{ld} {x.hit_rate_real:.1%} → {x.hit_rate_sim:.1%}" for ld, x in hits.iterrows())
        + ". Median |error| by run: "
        + ", ".join(f"{ld}/caching {c} {v:.1f} %" for (ld, c), v in per_run.items())
        + ". "
        + (
            "Missed by more than 20 %, with the two worst numbers of each: " + "; ".join(misses) + ". "
            if misses
            else ""
        )
        + _burst_note(r)
        + f"Caching's p50 TTFT speedup, real ({r.s7_repeat}) against simulated: "
        + ", ".join(
            f"{ld} {sp.loc[(ld, 'p50 TTFT'), 'real_speedup']:.1f}× against "
            f"{sp.loc[(ld, 'p50 TTFT'), 'sim_speedup']:.1f}×"
            for ld in dict.fromkeys(g["load"])
        )
        + "."
    )
    return _box("The simulator's prefix cache against Study 7's server (nothing fitted to it)", text)


# ---- beyond one GPU --------------------------------------------------------------------------------------------
def _fit_caveat(r, model: str) -> str:
    """How far the cost model of ``model`` is from the real server where it was checked: its held-out median |error|
    on Study 1's runs against the goal, so that a prediction made with it is read with that error (the simulator is
    calibrated on and checked against the real server, not validated by it where it misses its goal)."""
    t = r["sim_validation"].dropna(subset=["error_pct"]) if "model" in r["sim_validation"] else pd.DataFrame()
    t = t[t["model"] == model] if len(t) else t
    if t.empty:
        return ""
    err = median_abs_error(t, "gpu+overheads")
    where = f"{r.s1_repeat}'s held-out runs" if r.s1_repeat else "its held-out runs"
    return (
        f" Calibrated on Study 1's server and checked against {where}, this cost model's median |error| there is "
        f"{err:.1f} % (goal ≤ {GOAL_PCT:g} %)"
        + (": it misses its goal, and these predictions carry that error." if err > GOAL_PCT else ".")
    )


def capacity_setup(r) -> str:
    c, P = r.cap, r.P
    cost = gpu_source_words(c["cost"].gpu.model, c["cost"].source)
    return (
        f"Cost model: {cost}.{_fit_caveat(r, c['cost'].gpu.model)} SLO: p99 TTFT ≤ {c['slo'][0]:.1f} ms, p99 TPOT "
        f"≤ {c['slo'][1]:.2f} ms, set from the cost "
        "model's own speed at Study 1's mean lengths (a multiple of one mean prompt's prefill alone, and of one "
        f"sequence's decode step); lengths: {c['lengths'].source}; one replica sustains about {c['one']:.1f} req/s "
        f"on traces of at most {P['capacity_max_requests']:,} requests, found to a factor of "
        f"2^(1/{2 ** P['rate_search_refine']}): the unit of the rates below, not a capacity claim. "
        + _one_replica_elsewhere(r)
    )


def _one_replica_elsewhere(r) -> str:
    """The same replica, same SLO, on the longer traces of the capacity table of the Beyond one GPU page: a p99 over a
    few hundred requests moves with the trace, and the two pages' brackets for one replica differ by that."""
    from servelab.studies.s08_simulator.replica_capacity import SINGLE

    tried, cap = r.table("replica_capacity_tried"), r.table("replica_capacity")
    if tried is None or cap is None or tried.empty or cap.empty:
        return ""
    one = tried[(tried["router"] == SINGLE) & (tried["replicas"] == 1)]
    at = one[(one["rate"] - r.cap["one"]).abs() <= 1e-6 * r.cap["one"]]
    row = cap[cap["router"] == SINGLE]
    if at.empty or row.empty:
        return ""
    x, b = at.iloc[0], row.iloc[0]
    return (
        f"On the Beyond one GPU page's longer traces ({x.requests:,.0f} requests) that rate "
        + ("meets" if x.met else "misses")
        + f" the SLO (p99 TTFT {x.ttft_p99_ms:.0f} ms, p99 TPOT {x.tpot_p99_ms:.2f} ms), and one replica's "
        f"capacity there is bracketed at {b.met_req_s:.0f}–{b.missed_req_s:.0f} req/s."
    )


def _router_says(r, router: str, row) -> str:
    name = router_words(router)
    if row.met:
        return f"{name} needs {row.replicas:.0f} replicas"
    if row.status.startswith("skipped"):
        return f"{name} was not searched (time budget)"
    return f"{name} needs more than {r.P['max_replicas']}"


def _capacity_text(r) -> str:
    needed = r.table("capacity_needed")
    if needed is None or needed.empty:
        return ""
    top = needed[needed["rate"] == needed["rate"].max()].set_index("router")
    met = top[top["met"].fillna(False).astype(bool)]["replicas"].dropna()
    fewest = [router_words(x) for x in met.index[met == met.min()]] if len(met) else []
    if top["replicas"].nunique() == 1 and top["met"].all():
        end = "; all the same."
    elif len(fewest) > 1:  # a tie is a tie: name every router in it
        end = f"; the fewest with {_listing(fewest)}, tied."
    else:
        end = f"; the fewest with {fewest[0]}." if fewest else "."
    return (
        f"At {needed['rate'].max():,.0f} req/s ({r.P['capacity_rate_multiples'][-1]:g}× what one replica sustains) "
        + ", ".join(_router_says(r, name, row) for name, row in top.iterrows())
        + end
        + _no_cache_note(r, top)
    )


def _no_cache_note(r, top: pd.DataFrame) -> str:
    """Why affinity cannot gain here, and, where it needed fewer replicas all the same, what that difference rests on
    (the simulations' own request counts)."""
    aff = "prefix_affinity"
    others = top.drop(index=aff, errors="ignore")["replicas"]
    if aff not in top.index or not others.notna().any() or not top.loc[aff, "replicas"] < others.min():
        return " These replicas keep no prefix cache: here affinity can only cost balance."
    tried = r.table("capacity_tried")
    n = int(tried.loc[tried["rate"] == top["rate"].iloc[0], "requests"].min()) if tried is not None else 0
    return (
        " These replicas keep no prefix cache, so affinity's edge here is not from cache hits; a p99 over "
        f"{n:,} simulated requests rests on its {max(1, -(-n // 100))} slowest."
    )


def capacity(r) -> str:
    return _box("Capacity", _capacity_text(r))


def affinity_setup(r) -> str:
    a = r.aff
    # the rate search runs one replica with the larger pool (``report._affinity``); its cache starts empty too
    return (
        f"One replica with a prefix cache (empty at the start, filling as prompts repeat) and the larger pool sustains "
        f"about {a['one']:.0f} req/s of this workload within p99 TTFT ≤ {a['slo'][0]:.0f} ms and p99 TPOT ≤ "
        f"{a['slo'][1]:.1f} ms (set as the capacity section's SLO, from this workload's own mean prompt and output: "
        f"hence a TTFT bound of its own); pools: {', '.join(f'{b:,}' for b in a['pools'])} blocks per replica."
    )


def _affinity_text(r, short: bool = False) -> str:
    gain = r.table("affinity_gain")
    if gain is None or not len(gain):
        return ""
    parts = []
    for pool, g in gain.groupby("pool_blocks", sort=False):
        top = g.loc[g["rate"].idxmax()]
        parts.append(
            f"pool {pool:,} blocks: hit rate {top.affinity_hit_rate:.0%} with affinity against "
            f"{top.best_other_hit_rate:.0%} at best without, p99 TTFT {top.affinity_ttft_p99_ms:.0f} against "
            f"{top.best_other_ttft_p99_ms:.0f} ms ({router_words(top.best_other)}) at {top.rate:,.0f} req/s"
        )
    lead = "With a prefix cache in every replica, cache-aware routing (simulated): " if short else ""
    return lead + "; ".join(parts) + "."


def affinity(r) -> str:
    return _box("What cache-aware routing buys (simulated)", _affinity_text(r))


def _speed_text(r) -> str:
    s = r.speed
    if not s:
        return ""
    about, extrapolated = ("about ", " (extrapolated)") if s["hour_extrapolated"] else ("", "")
    n = s.get("repeats", 1)
    # the wall time is the first repeat's, the hour's the median over repeats (``report._speed``): say which
    first, median = (" in the first of its repeats", f" (the median over {n} repeats)") if n > 1 else ("", "")
    # the times as the table beside it gives them (``sections.speed_view``: three significant figures)
    wall, hour = (format_value(str(s[k])) for k in ("wall_s", "hour_wall_s"))
    return (
        f"{s['requests']:,} requests ({s['simulated_s']:,.0f} s at {s['rate']:,.0f} req/s over {s['replicas']} "
        f"replicas) took {wall} s{first}: **{s['sim_requests_per_s']:,.0f} simulated requests/s**. One "
        f"hour would take {about}{hour} s{extrapolated}{median}, "
        f"{'within' if s['meets_goal'] else 'over'} the {s['goal_s']:.0f} s goal."
    )


def speed(r) -> str:
    return _box("Simulator speed", _speed_text(r))
