"""Study 7's reporting path: everything its page shows, computed from the runs' files (``report``), and the page
text: takeaways and compact tables (the full tables are the runs' CSVs).

Each repeat's verdicts come from its own raw sweeps (speedups, breakevens and cost fits derived at report time);
tables and figures show each point's median over repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.markdown import format_value, separated
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.tested_on import model_tested_on
from servelab.studies.s07_prefix_cache import verdicts
from servelab.studies.s07_prefix_cache.cost_fit import prefill_costs, sharing_costs
from servelab.studies.s07_prefix_cache.derive import breakeven, breakeven_of, sharing_ratios, speedups, turn_speedups

STUDY = "07_prefix_cache"
# what identifies one measured point of each raw table: its median over repeats is what the page shows
KEYS = {
    "prefix_length": ["prefix_tokens", "mode"],
    "multi_turn": ["turn", "metric", "mode"],
    "batch_sharing": ["prefix_tokens", "n", "sharing"],
    "policy_hit_rates": ["policy", "alpha", "capacity", "unit"],
    "serving_summary": ["load", "caching"],
}
SERVING_COLUMNS = {
    "load": "load",
    "caching": "caching",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "ttft_p99_ms": "TTFT p99 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "throughput_tok_s": "output tokens/s",
    "hit_rate_engine": "hit rate, engine (%)",
    "hit_rate_metrics": "hit rate, /metrics (%)",
    "ideal_hit_rate": "ideal hit rate (%)",
    "n_repeats": "repeats",
}
HIT_RATES = ("hit_rate_engine", "hit_rate_metrics", "ideal_hit_rate")  # fractions, shown as percentages
# decimals each serving column is shown with: a millisecond's thousandths and a token's fractions per second are
# below what the runs resolve ("2019.596" tokens/s, "1137.666" ms)
SERVING_DECIMALS = {
    "ttft_p50_ms": 1,
    "ttft_p99_ms": 1,
    "tpot_p50_ms": 2,
    "throughput_tok_s": 0,
    **dict.fromkeys(HIT_RATES, 1),
}


@dataclass
class Study7Page:
    runs: RunSet
    findings: list[Finding]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # raw (pooled) and derived tables, by name
    engine: dict = field(default_factory=dict)  # the first run's engine.json ({} for a run from before it)

    @property
    def device(self) -> str:
        return self.runs.device_name

    @property
    def P(self) -> dict:
        return self.runs.params

    @property
    def model(self) -> str:
        return str(self.P.get("model", "?")).replace("config:", "")

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())

    def has(self, *names: str) -> bool:
        return all(not self[n].empty for n in names)


def derived(raw: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The derived tables of one set of raw sweeps (a repeat's, or the median over repeats); a table whose raw sweep
    is missing is left out."""
    out = dict(raw)
    pl, mt, bs = raw.get("prefix_length"), raw.get("multi_turn"), raw.get("batch_sharing")
    if pl is not None and not pl.empty:
        out["prefix_length_speedup"] = speedups(pl)
        out["prefill_cost_fit"] = prefill_costs(pl)
    if mt is not None and not mt.empty:
        out["multi_turn_speedup"] = turn_speedups(mt)
    if bs is not None and not bs.empty:
        out["batch_sharing_breakeven"] = breakeven(bs)
        out["batch_sharing_cost_fit"] = sharing_costs(bs)
    return out


def _raw(runs: RunSet, pooled: bool) -> dict[str, pd.DataFrame]:
    out = {}
    for name, keys in KEYS.items():
        df = runs.table(name)
        if df.empty:
            continue
        out[name] = pool_repeats(df, keys) if pooled else df.drop(columns=["repeat", "part"], errors="ignore")
    return out


def serving_gaps(r: Study7Page) -> str:
    """Which server runs some repeats did not complete, and why: the summary's numbers rest on the others."""
    raw = r.runs.table("serving_summary") if r.runs.measured else pd.DataFrame()
    if raw.empty or "status" not in raw:
        return ""
    lines = []
    for (load, caching), g in raw.groupby(["load", "caching"], sort=False):
        bad = g[g["status"] != "ok"]
        if len(bad):
            why = "; ".join(f"{r.runs.repeat_name(b.repeat)}: {b.status}" for b in bad.itertuples())
            lines.append(f"{load}, caching {caching}: {len(g) - len(bad)} of {len(g)} repeats ran it ({why})")
    return ("Server runs not completed in every repeat (the table's medians are over the repeats that ran them): "
            + "; ".join(lines) + ".") if lines else ""  # fmt: skip


def judge(t: dict[str, pd.DataFrame], P: dict, shown: dict[str, pd.DataFrame] | None = None) -> list[Finding]:
    """F7.1–F7.4 by today's rules from one set of tables; a claim whose sweep is missing is left out. ``shown``:
    the page's tables (medians over repeats), which the notes quote beside the numbers the rules read: a note of one
    repeat's numbers read 3.74× beside a table of 3.79×."""
    on = model_tested_on(P.get("model", "?"), P.get("dtype", "?"))
    s = shown or {}
    out = []
    if "prefix_length_speedup" in t:
        pl = _pair(s, "prefix_length_speedup", "prefill_cost_fit")
        out.append(verdicts.f71(t["prefix_length_speedup"], t.get("prefill_cost_fit"), tested_on=on, shown=pl))
    if "multi_turn_speedup" in t:
        out.append(verdicts.f72(t["multi_turn_speedup"], tested_on=on, shown=s.get("multi_turn_speedup")))
    if "batch_sharing_breakeven" in t:
        bs = _pair(s, "batch_sharing_breakeven", "batch_sharing_cost_fit")
        each = s.get(BY_REPEAT)
        out.append(verdicts.f73(t["batch_sharing_breakeven"], t.get("batch_sharing_cost_fit"), on, bs, each))
    if "policy_hit_rates" in t:
        out.append(verdicts.f74(t["policy_hit_rates"], P.get("sim_prefixes", 0), P.get("sim_requests")))
    return out


def _pair(t: dict[str, pd.DataFrame], table: str, fit: str) -> tuple[pd.DataFrame, pd.DataFrame | None] | None:
    return (t[table], t.get(fit)) if table in t else None


def repeat_findings(rep: RunSet) -> list[Finding]:
    return judge(derived(_raw(rep, pooled=False)), rep.params)


def complete(findings: list[Finding]) -> list[Finding]:
    """Every claim of the study in the seed's order: one no repeat judged reads inconclusive, not measured."""
    have = {f.id: f for f in findings}
    missing = not_measured(STUDY, "its sweep is missing from the runs")
    return [have.get(f.id, f) for f in missing]


# the speedup tables whose points the verdicts read, by their keys: each point's median over repeats of that repeat's
# speedup, the statistic F7.1's and F7.2's headlines take. The ratio of the pooled TTFTs read 1.50x at 512 tokens
# beside a headline of 1.42x (repeats 1.41, 1.42, 1.55)
SPEEDUP_KEYS = {"prefix_length_speedup": ["prefix_tokens"], "multi_turn_speedup": ["metric", "turn"]}


def _per_repeat(runs: RunSet) -> dict[int, dict[str, pd.DataFrame]]:
    """Each repeat's derived tables, by repeat index: the verdicts and the pooled speedup tables both read them."""
    return {rep.repeats[0]: derived(_raw(rep, pooled=False)) for rep in runs.per_repeat()}


def _speedups_over_repeats(per: dict[int, dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in SPEEDUP_KEYS}
    for k, d in per.items():
        for name in SPEEDUP_KEYS:
            if name in d and not d[name].empty:
                frames[name].append(d[name].assign(repeat=k))
    return {
        name: pool_repeats(pd.concat(fs, ignore_index=True), SPEEDUP_KEYS[name]).drop(columns="n_repeats")
        for name, fs in frames.items()
        if fs
    }


BY_REPEAT = "batch_sharing_breakeven_by_repeat"  # each repeat's breakevens: (repeat, prefix_tokens, breakeven_n)


def _sharing_over_repeats(per: dict[int, dict[str, pd.DataFrame]], order: list[int]) -> dict[str, pd.DataFrame]:
    """The batch-sharing table the page shows, as F7.1's speedups are: at each prefix length and n, the median over
    repeats of each repeat's own time ratio (independent / shared), the breakeven read off those medians, and each
    repeat's own breakeven beside it (``BY_REPEAT``; ``repeat``: its place in ``order``, the run order). The ratio
    of the pooled times read 3.11× at 512 tokens and n = 32 where the repeats' own ratios were 3.42, 2.73 and 3.20.
    """
    ratios, each = [], []
    for k, d in per.items():
        bs = d.get("batch_sharing")
        if bs is None or bs.empty:
            continue
        ratios.append(sharing_ratios(bs).assign(repeat=k))
        be = d["batch_sharing_breakeven"]
        each.append(be[["prefix_tokens", "breakeven_n"]].assign(repeat=order.index(k)))
    if not ratios:
        return {}
    pooled = pool_repeats(pd.concat(ratios, ignore_index=True), ["prefix_tokens", "n"])
    by_repeat = pd.concat(each, ignore_index=True)
    be = breakeven_of(pooled[["prefix_tokens", "n", "ratio"]])
    return {"batch_sharing_breakeven": be, BY_REPEAT: by_repeat}


def report(runs: RunSet) -> Study7Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    if not runs.measured:
        return Study7Page(runs, not_measured(STUDY))
    per = _per_repeat(runs)
    tables = derived(_raw(runs, pooled=True))
    tables.update(_speedups_over_repeats(per))
    tables.update(_sharing_over_repeats(per, list(runs.repeats)))
    findings = complete(runs.combined(lambda rep: judge(per[rep.repeats[0]], rep.params, tables)))
    req = runs.part(runs.parts[0]).repeat(runs.repeats[0]).table("serving_requests")  # one repeat's requests
    if not req.empty:
        tables["serving_requests"] = req
    engine = next((r.json("engine") for r in runs.runs if r.json("engine")), None) or {}
    return Study7Page(runs, findings, tables, engine)


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The server's output throughput with caching on over off under the burst load, the like-for-like counterpart
    of a published throughput gain, beside the largest isolated prefill speedup from a cached prefix (median over
    repeats); None if not measured. The prefill speedup alone (3.79×) stood against SGLang's throughput gain while
    the server runs beside it read 1.94×."""
    s = _speedups_over_repeats(_per_repeat(runs)).get("prefix_length_speedup", pd.DataFrame())
    if s.empty:
        return None
    best = s.loc[s["speedup"].idxmax()]
    prefill = f"{best['speedup']:.2f} × prefill speedup with a cached {int(best['prefix_tokens']):,}-token prefix"
    gain = throughput_gain(runs)
    if gain is None:
        return f"{best['speedup']:.2f} ×", prefill[prefill.index("prefill") :]
    x, load, off, on, said = gain
    return (
        f"{x:.2f} ×",
        f"server output throughput with prefix caching on over off, {load} load, {off:,.0f} → {on:,.0f} tokens/s, "
        f"{said}; an isolated request's {prefill}",
    )


def throughput_gain(runs: RunSet) -> tuple[float, str, float, float, str] | None:
    """The server's output throughput caching on over off at the load that reaches the most (the burst), from the
    serving table's medians over the repeats that ran it: (gain, load, off, on, over which repeats); None where no
    load ran both ways."""
    raw = runs.table("serving_summary")
    if raw.empty or "throughput_tok_s" not in raw:
        return None
    s = pool_repeats(raw, KEYS["serving_summary"])
    s = s[s["status"] == "ok"].set_index(["load", "caching"])
    loads = [ld for ld in dict.fromkeys(s.index.get_level_values(0)) if {(ld, "off"), (ld, "on")} <= set(s.index)]
    if not loads:
        return None
    load = max(loads, key=lambda ld: s.loc[(ld, "on"), "throughput_tok_s"])
    off, on = s.loc[(load, "off")], s.loc[(load, "on")]
    ran = int(min(off["n_repeats"], on["n_repeats"]))
    said = f"the ratio of the medians over the {ran} repeats that ran it" if ran > 1 else "one repeat"
    return on.throughput_tok_s / off.throughput_tok_s, load, off.throughput_tok_s, on.throughput_tok_s, said


def published(r: Study7Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, published_value(r.runs), r.device)


# ---- takeaways -------------------------------------------------------------------------------------------------
def takeaways(r: Study7Page) -> str:
    """One sentence per claim, the floor sentence after F7.1, and one for the server runs."""
    if not r.runs.measured:
        return ""
    said = [finding_sentence(f) for f in r.findings]
    return takeaway_list([*said[:1], floor_sentence(r), *said[1:], serving_sentence(r)])


def floor_sentence(r: Study7Page) -> str:
    pl = r["prefix_length"]
    if pl.empty or "pct_of_floor" not in pl:
        return ""
    unc = pl[(pl["status"] == "ok") & (pl["mode"] == "uncached")]
    if unc.empty:
        return ""
    small = unc[unc["prefix_tokens"] == unc["prefix_tokens"].min()]
    big = unc[unc["prefix_tokens"] == unc["prefix_tokens"].max()]
    return (
        f"The uncached prefill reaches {big['pct_of_floor'].max():.0f}% of its roofline floor at "
        f"{int(big['prefix_tokens'].iloc[0]):,} tokens but only {small['pct_of_floor'].max():.1f}% at "
        f"{int(small['prefix_tokens'].iloc[0]):,}, where a forward costs its fixed overheads whatever the tokens: "
        "a cache can only save the part of the time that grows with the prefix."
    )


def serving_ok(r: Study7Page) -> bool:
    s = r["serving_summary"]
    return not s.empty and bool((s["status"] == "ok").all())


def serving_sentence(r: Study7Page) -> str:
    if not serving_ok(r):
        return ""
    summary = r["serving_summary"]
    s = summary.set_index(["load", "caching"])
    parts = []
    for load in dict.fromkeys(summary["load"]):
        if (load, "off") not in s.index or (load, "on") not in s.index:
            continue
        off, on = s.loc[(load, "off")], s.loc[(load, "on")]
        # a load some repeats skipped (their time budget) is the median over those that ran: say how many
        ran, total = int(min(off.get("n_repeats", 0), on.get("n_repeats", 0))), len(r.runs.repeats)
        over = f" (over {ran} of the {total} repeats, the ones that ran it)" if 0 < ran < total else ""
        parts.append(
            f"{load}{over}: median TTFT {off.ttft_p50_ms:,.1f} → {on.ttft_p50_ms:,.1f} ms "
            f"({off.ttft_p50_ms / on.ttft_p50_ms:.1f}×), p99 {off.ttft_p99_ms:,.1f} → {on.ttft_p99_ms:,.1f} ms, "
            f"output throughput {off.throughput_tok_s:,.0f} → {on.throughput_tok_s:,.0f} tokens/s, "
            f"hit rate {on.hit_rate_engine:.1%} (/metrics read {on.hit_rate_metrics:.1%}; "
            f"ideal {on.ideal_hit_rate:.1%})"
        )
    return "Serving with prefix caching off → on: " + "; ".join(parts) + "." if parts else ""


# ---- method and details ----------------------------------------------------------------------------------------
SCHEDULERS = {"fcfs": "FCFS", "eager_cont_batch": "EagerContBatch", "chunked_prefill": "ChunkedPrefill"}  # the seed's


def setup(r: Study7Page) -> str:
    """The device, its measured ceilings, the engine's settings and the wall time, as the method section states."""
    if not r.runs.measured:
        return "Not measured."
    c, P = r.runs.ceilings, r.P
    text = (
        f"Device: {r.device}. Profile {P.get('profile', '?')}; measured ceilings: copy {c.get('copy_gb_s', 0):,.0f} "
        f"GB/s (read+write), {c.get('matmul_dtype', '?')} matmul {c.get('matmul_tflop_s', 0):,.1f} TFLOP/s. Engine: "
        f"{P.get('model')} ({P.get('dtype')}), {P.get('num_blocks', 0):,} KV blocks of {P.get('block_size')} tokens, "
        f"scheduler {SCHEDULERS.get(P.get('scheduler'), P.get('scheduler'))}, prefix eviction "
        f"{verdicts.policy_name(P.get('eviction'))}, up to {P.get('max_num_seqs')} "
        f"sequences and {P.get('max_num_batched_tokens', 0):,} tokens per step."
    )
    st = r.engine.get("stats") or {}
    if st:
        text += (
            f" KV pool {st.get('kv_pool_gib', 0):.2f} GiB, attention {st.get('attention_backend')}, varlen prefill "
            f"{st.get('varlen_prefill')}, {st.get('cuda_graphs')} CUDA graphs."
        )
    if "elapsed_s" in r.engine:
        text += f" The measurements took {r.engine['elapsed_s']:.0f} s (budget {P.get('time_budget_s', 0):.0f} s)."
    return text


def serve_source(r: Study7Page) -> str:
    """The server trace's description: recorded by the run, else rebuilt from its parameters (as ``prefix_trace``
    words it)."""
    if r.engine.get("serve_source"):  # recorded by the run as "system prompts of 2048 tokens": separated here
        return format_value(r.engine["serve_source"])
    P = r.P
    if "serve_requests" not in P:
        return ""
    return (
        f"{P['serve_requests']} requests, Poisson {P['serve_rate']:g} req/s; prefix: one of {P['serve_prefixes']} "
        f"system prompts of {P['serve_prefix_tokens']:,} tokens, Zipf α={P['serve_alpha']:g}; then "
        f"{P['serve_suffix_tokens']} tokens of its own; {P['serve_output_tokens']} out"
    )


def statuses(df: pd.DataFrame) -> str:
    """Points per status, in one line."""
    if df.empty:
        return "Not measured."
    counts = df["status"].value_counts()
    return "Points: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "."


def prefix_length_caption(r: Study7Page) -> str:
    """What the prefix-length table's numbers are: each column's own median over the repeats, so a row's speedup
    need not be its two times' ratio (4.19 / 2.80 = 1.50× beside 1.42× at 512 tokens, the three medians from three
    different repeats)."""
    n = len(r.runs.repeats)
    if n < 2:
        return ""
    return (
        f"Each column is its own median over the {n} repeats: a TTFT is the median of the repeats' medians, and the "
        "speedup and its low–high range are the medians of each repeat's own (its uncached over its cached time, "
        "and its quartiles' ratios), so a row's speedup need not equal the ratio of the two TTFTs beside it. F7.1's "
        "note gives one repeat's times with their ratio."
    )


def prefix_length_view(r: Study7Page) -> pd.DataFrame:
    """Per prefix length: TTFT both ways, the speedup with its quartile range, and the tokens computed."""
    sp, pl = r["prefix_length_speedup"], r["prefix_length"]
    if sp.empty:
        return sp
    comp = pl.pivot_table(index="prefix_tokens", columns="mode", values="computed_tokens")
    out = sp.set_index("prefix_tokens")[["uncached_ms", "cached_ms", "speedup", "speedup_lo", "speedup_hi"]]
    out = out.join(comp.add_prefix("computed tokens, "), how="left")
    names = {
        "uncached_ms": "uncached TTFT (ms)",
        "cached_ms": "cached TTFT (ms)",
        "speedup": "speedup (×)",
        "speedup_lo": "low (×)",
        "speedup_hi": "high (×)",
    }
    out = out.rename(columns=names).round(2).rename_axis(PREFIX).reset_index()
    return separated(out, [PREFIX, *[c for c in out if c.startswith("computed tokens")]])


PREFIX = "prefix (tokens)"
FIT_X = {"computed_tokens": "tokens prefilled", "prefix_tokens": "tokens cached"}  # what each prefill line is against


def cost_fit_view(df: pd.DataFrame, per: str = "token") -> pd.DataFrame:
    """A fit table for reading: ``per`` is the unit of its x (a token, a request), which the slope is per."""
    names = {"prefix_tokens": PREFIX, "x": "against", "fixed": "fixed (ms)", "slope": f"slope (ms per {per})",
             "r2": "r²"}  # fmt: skip
    out = df.assign(x=df["x"].map(FIT_X).fillna(df["x"])) if "x" in df else df
    out = out.rename(columns=names).round(4)
    return separated(out, [PREFIX]) if PREFIX in out else out


def multi_turn_view(r: Study7Page) -> pd.DataFrame:
    ts = r["multi_turn_speedup"]
    if ts.empty:
        return ts
    t = ts.pivot_table(index=["turn", "prompt_tokens"], columns="metric", values="speedup").round(2)
    t = (
        t.rename(columns=lambda m: f"{'TTFT' if m == 'ttft' else m} speedup (×)")
        .reset_index()
        .rename_axis(columns=None)
    )
    return separated(t.rename(columns={"prompt_tokens": "prompt (tokens)"}), ["prompt (tokens)"])


def batch_sharing_caption(r: Study7Page) -> str:
    """What the batch-sharing table's numbers are: medians over the repeats of each repeat's own ratio, as the
    prefix-length table's speedups are, with each repeat's own breakeven beside the one read off those medians."""
    n = len(r.runs.repeats)
    if n < 2 or r[BY_REPEAT].empty:
        return ""
    return (
        f"Each ratio is the median over the {n} repeats of each repeat's own (its independent over its shared time), "
        "as in the prefix-length table; the breakeven is read off those medians, and each repeat's own is given "
        "beside it, in run order."
    )


def batch_sharing_view(r: Study7Page) -> pd.DataFrame:
    """Per prefix length: where sharing breaks even (and where each repeat's did), and the ratio at the largest
    batch."""
    be = r["batch_sharing_breakeven"]
    if be.empty:
        return be
    cols = {"prefix_tokens": PREFIX, "breakeven_n": "breaks even at n", "max_n": "largest n",
            "ratio_at_max_n": "independent / shared there (×)"}  # fmt: skip
    out = be[list(cols)]
    each = r[BY_REPEAT]
    if not each.empty and each["repeat"].nunique() > 1:
        out = out.assign(each=out["prefix_tokens"].map(verdicts.breakevens_each(each)))
        out = out[["prefix_tokens", "breakeven_n", "each", "max_n", "ratio_at_max_n"]]
        cols = {**cols, "each": "each repeat's breakeven n"}
    return separated(out.rename(columns=cols).round(2), [PREFIX])


def policies_view(r: Study7Page) -> pd.DataFrame:
    sim = r["policy_hit_rates"]
    if sim.empty:
        return sim
    top = sim[sim["alpha"] == verdicts.SEED_ALPHA] if (sim["alpha"] == verdicts.SEED_ALPHA).any() else sim
    t = top.pivot_table(index="capacity", columns="policy", values="hit_rate").round(3)
    # the policies by the page's names ("perfect LFU", not lfu_perfect); radix counts blocks, the others whole
    # prefixes: radix above Belady's MIN read as beating an offline bound
    return t.rename(columns=lambda c: "radix (blocks)" if c == "radix" else verdicts.policy_name(c))


def serving_view(r: Study7Page) -> pd.DataFrame:
    s = r["serving_summary"]
    if s.empty:
        return s
    out = s[[c for c in SERVING_COLUMNS if c in s]]
    out = out.assign(**{c: 100 * out[c] for c in HIT_RATES if c in out})
    out = out.round(SERVING_DECIMALS)
    wide = [c for c in SERVING_DECIMALS if c in out and c not in HIT_RATES]  # ms and tokens/s run past 1,000
    out = separated(out, wide, SERVING_DECIMALS).rename(columns=SERVING_COLUMNS)
    # with caching off there is no hit to count: say so instead of NaN
    hits = [SERVING_COLUMNS[c] for c in HIT_RATES[:2] if SERVING_COLUMNS[c] in out]
    off = out["caching"].eq("off") if "caching" in out else pd.Series(False, index=out.index)
    for c in hits:
        out[c] = out[c].astype(object).where(~(off & out[c].isna()), "— (off)")
    return out
