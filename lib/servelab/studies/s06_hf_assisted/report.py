"""Study 6's reporting path: everything its page shows, computed from the runs' raw files (``report``), and the page
text. Each repeat's verdicts come from its own per-prompt times (speedups, cost ratios and α recomputed here by
today's rules); tables and figures show each point's median over repeats. ``real_alpha`` is the α of the real drafts
with bootstrap intervals, from the per-prompt agreement the runs recorded: Study 3 reads it at render time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.s06_hf_assisted import analysis, verdicts
from servelab.studies.s06_hf_assisted.alpha import real_alpha
from servelab.studies.s06_hf_assisted.measure import PARTS
from servelab.studies.s06_hf_assisted.runs import Pair

STUDY = "06_hf_assisted"
# both claims read the speedups of every prompt, which the parts split between them
NEEDS = {fid: tuple(PARTS) for fid in ("F6.1", "F6.2")}
SIZE_COLUMNS = ["model", "params", "layers", "weight_bytes"]
METHOD_LABELS = {
    "assisted": "assistant_model",
    "prompt_lookup": "prompt lookup",
    "own": "servelab speculative",
    "own_plain": "servelab engine, target alone",
}
# what each method's speedup is over: the engine's speculation is timed against the same engine running the target
# alone, not against HF ("0.89× the plain baseline" stood beside the table's 17.96× over plain HF generate)
BASELINES = {"own": "the servelab engine running the target alone"}
HF_BASELINE = "plain HF generate"


@dataclass
class Derived:
    """One repeat's (or one pooled set's) derived tables, from its raw ones."""

    per_prompt: pd.DataFrame  # speedup per prompt, method, pair, length
    speedups: pd.DataFrame  # median and quartiles over prompts
    costs: pd.DataFrame  # decode ms/token per model
    pairs: pd.DataFrame  # pair × length: c, α, speedup, prompts
    seed_costs: pd.DataFrame
    tested_on: str
    min_prompts: int


@dataclass
class Study6Page:
    runs: RunSet
    findings: list[Finding]
    speedups: pd.DataFrame = field(default_factory=pd.DataFrame)  # median over repeats
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    costs: pd.DataFrame = field(default_factory=pd.DataFrame)
    seed_costs: pd.DataFrame = field(default_factory=pd.DataFrame)
    coverage: pd.DataFrame = field(default_factory=pd.DataFrame)  # prompts per method, pair and length
    own_vs_engine: pd.DataFrame = field(default_factory=pd.DataFrame)
    own_acceptance: pd.DataFrame = field(default_factory=pd.DataFrame)
    match_rates: pd.DataFrame = field(default_factory=pd.DataFrame)
    real_alpha: pd.DataFrame = field(default_factory=pd.DataFrame)
    distill: pd.DataFrame = field(default_factory=pd.DataFrame)
    tested_on: str = ""
    min_prompts: int = verdicts.MIN_PROMPTS

    @property
    def device(self) -> str:
        return self.runs.device_name

    @property
    def legacy(self) -> bool:
        return self.runs.fingerprint == "legacy"


def sizes(rep: RunSet) -> pd.DataFrame:
    """Each model's size: the run's ``models.csv``, or (the legacy run) the sizes its ``decode_costs.csv`` kept."""
    for name in ("models", "decode_costs"):
        t = rep.first(name)
        if not t.empty and set(SIZE_COLUMNS) <= set(t.columns):
            return t
    return pd.DataFrame(columns=SIZE_COLUMNS)


def tested_on(rep: RunSet) -> str:
    """What the runs were measured on: each model's name, size and layers, and where its weights came from."""
    m = rep.first("models")
    if "tested_on" in m and m["tested_on"].notna().any():
        text = str(m["tested_on"].dropna().iloc[0])
    else:
        s = sizes(rep)
        if s.empty:
            return "models not recorded"
        roles = rep.first("family")
        target = str(roles.loc[roles["role"] == "target", "model"].iloc[0]) if "role" in roles else s["model"].iloc[0]

        def one(r) -> str:
            return f"{r.model} ({r.params / 1e6:.0f}M, {int(r.layers)} layers)"

        t = s[s["model"] == target]
        drafts = s[s["model"] != target].sort_values("params")
        origin = (
            "the project's own small family, trained on a code corpus (the run before SmolLM2)"
            if not roles.empty
            else "weights as loaded"
        )
        text = f"{one(next(t.itertuples()))} with drafts {', '.join(one(r) for r in drafts.itertuples())}; {origin}"
        text += f"; {rep.params.get('dtype', '')}"
    return text + "; HF generate, greedy, batch 1"


def run_pairs(runs: pd.DataFrame) -> list[Pair]:
    """The assisted pairs the runs planned, in the order they were planned."""
    if runs.empty or "method" not in runs:
        return []
    a = runs[runs["method"] == "assisted"][["draft", "target"]].drop_duplicates()
    return [Pair(r.draft, r.target) for r in a.itertuples()]


def lengths_of(rep: RunSet, times: pd.DataFrame) -> list[int]:
    got = rep.params.get("lengths")
    return [int(x) for x in got] if got else sorted(int(x) for x in times["length"].unique())


def derive(rep: RunSet) -> Derived:
    """From one repeat's raw tables (its parts together): speedups, decode costs, the pair × length table."""
    times, runs, alpha = rep.table("times"), rep.table("runs"), rep.table("alpha")
    for df in (runs, times):
        if "draft" in df:
            df["draft"] = df["draft"].fillna("")
    per_prompt = analysis.speedups(times) if not times.empty else pd.DataFrame()
    summary = analysis.summarize_speedups(per_prompt) if not per_prompt.empty else pd.DataFrame()
    costs = analysis.decode_costs(runs, sizes(rep))
    pairs = (
        analysis.pair_summary(run_pairs(runs), costs, summary, alpha, runs, lengths_of(rep, times))
        if not summary.empty
        else pd.DataFrame()
    )
    P = rep.params
    min_prompts = verdicts.min_prompts_for(str(P.get("profile", "full")), int(P.get("n_prompts") or 1))
    return Derived(per_prompt, summary, costs, pairs, rep.table("seed_costs"), tested_on(rep), min_prompts)


def repeat_findings(rep: RunSet, seed_costs: pd.DataFrame | None = None) -> list[Finding]:
    """F6.1 and F6.2 by today's rules from one repeat's per-prompt times. ``seed_costs``: the seed shapes' costs the
    notes quote (``seed_costs_over_repeats``), else this repeat's own; neither rule reads them."""
    d = derive(rep)
    seed = seed_costs if seed_costs is not None else d.seed_costs
    seed = seed if not seed.empty else None
    return verdicts.findings(d.pairs, d.per_prompt, seed, tested_on=d.tested_on, min_prompts=d.min_prompts)


def seed_costs_over_repeats(runs: RunSet) -> pd.DataFrame:
    """The seed shapes' HF costs over every repeat that timed them: each column's median per pair (``c`` the median
    of each repeat's own c), ``c_each`` every repeat's c in repeat order ("1.15 / 0.86 / 0.86") and ``implausible``
    the repeats whose c is not physically plausible, in words (``verdicts.implausible_seed_costs``). The notes
    quoted the costs of the repeat nearest the median speedup, whatever their own spread: c = 1.15 for
    qwen2-0.5b → qwen2-1.5b, a draft slower than its target, where the other repeats read 0.86."""
    named = [(runs.repeat_name(rep.repeats[0]), rep.table("seed_costs")) for rep in runs.per_repeat()]
    named = [(n, t) for n, t in named if not t.empty and "c" in t]
    if not named:
        return pd.DataFrame()
    pooled = _pool([t for _, t in named], ["pair"])
    each = pd.concat([t.assign(_order=i) for i, (_, t) in enumerate(named)], ignore_index=True)
    c_each = (
        each.sort_values("_order").groupby("pair", sort=False)["c"].agg(lambda v: " / ".join(f"{x:.2f}" for x in v))
    )
    flagged = verdicts.implausible_seed_costs(named)
    return pooled.assign(
        c_each=pooled["pair"].map(c_each).fillna(""), implausible=pooled["pair"].map(flagged).fillna("")
    )


def _pool(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
    frames = [f.assign(repeat=i) for i, f in enumerate(frames) if not f.empty]
    return pool_repeats(pd.concat(frames, ignore_index=True), keys) if frames else pd.DataFrame()


def _pool_speedups(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The speedups' medians over repeats, with ``prompts`` the fewest any repeat had at that point (not their median:
    a point counts in a repeat's verdict only over ``min_prompts`` prompts of that repeat) and ``prompts_by_repeat``
    each repeat's count ("8, 9, 7"), in repeat order."""
    keys = ["method", "pair", "target", "draft", "length"]
    pooled = _pool(frames, keys)
    if pooled.empty or "prompts" not in pooled:
        return pooled
    g = pd.concat([f for f in frames if not f.empty]).groupby(keys, dropna=False)["prompts"]
    counts = g.agg(prompts="min", prompts_by_repeat=lambda v: ", ".join(str(int(x)) for x in v))
    return pooled.drop(columns="prompts").merge(counts.astype({"prompts": int}).reset_index(), on=keys, how="left")


def _pool_coverage(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per method, pair and length, the fewest prompts any repeat measured, as the speedup table counts them (their
    median read 8 prompt-lookup prompts at 512 tokens beside that table's 7, from repeats of 8, 9 and 7); NaN where no
    repeat measured the pair at that length, so a repeat that measured none where the others did reads 0."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    d = pd.concat(frames, ignore_index=True)
    keys = ["method", "pair"]
    g = d.groupby(keys, sort=False)
    counts = [k for k in d.columns if k not in keys]
    fewest = g[counts].min().where(g[counts].max() > 0)
    return fewest.join(g.size().rename("n_repeats")).reset_index()


def _pool_matches(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Every repeat's runs together, per method and pair: the runs, and the share equal to plain greedy and the mean
    matching prefix over all of them. Medians over repeats of the runs (9) and of the rate (1/8) read "9 runs,
    12.5%", which no count of runs gives."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    d = pd.concat(frames, ignore_index=True)
    d = d.assign(exact=d["exact_match_rate"] * d["runs"], prefix=d["matching_prefix_mean"] * d["runs"])
    g = d.groupby(["method", "pair"], sort=False)
    out = g[["runs", "exact", "prefix"]].sum().join(g.size().rename("n_repeats"))
    out = out.assign(exact_match_rate=out["exact"] / out["runs"], matching_prefix_mean=out["prefix"] / out["runs"])
    return out.reset_index()[["method", "pair", "runs", "exact_match_rate", "matching_prefix_mean", "n_repeats"]]


def report(runs: RunSet) -> Study6Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    if not runs.measured:
        return Study6Page(runs, not_measured(STUDY))
    # the seed shapes' costs in the notes are the median over the repeats, with an implausible repeat named: each
    # repeat's note quoted its own, and the note kept (that of the median speedup) had the implausible one
    seed_costs = seed_costs_over_repeats(runs)
    findings = runs.combined(lambda rep: repeat_findings(rep, seed_costs), needs=NEEDS)
    # the views pool whole repeats where there are any: a repeat begun part by part times fewer prompts, and a
    # median over repeats of different prompt sets would describe neither
    reps = [rep for rep in runs.per_repeat() if rep.has_parts(PARTS)] or runs.per_repeat()
    per = [derive(rep) for rep in reps]
    raw_runs = [rep.table("runs") for rep in reps]
    raw_times = [rep.table("times") for rep in reps]
    lengths = lengths_of(runs, runs.table("times"))
    cover = [
        analysis.coverage(r.assign(draft=r["draft"].fillna("")), t, lengths)
        for r, t in zip(raw_runs, raw_times, strict=True)
        if not r.empty
    ]
    return Study6Page(
        runs,
        findings,
        speedups=_pool_speedups([d.speedups for d in per]),
        pairs=_pool([d.pairs for d in per], ["pair", "draft", "target", "length"]),
        costs=_pool([d.costs for d in per], ["model"]),
        seed_costs=seed_costs,
        coverage=_pool_coverage(cover),
        own_vs_engine=_pool_speedups([analysis.own_vs_engine(t) for t in raw_times if not t.empty]),
        own_acceptance=_pool([analysis.own_acceptance(r) for r in raw_runs if "status" in r], ["pair"]),
        match_rates=_pool_matches([analysis.match_rates(r) for r in raw_runs if "matches_plain" in r]),
        real_alpha=real_alpha(runs),
        distill=runs.first("distill"),
        tested_on=per[0].tested_on,
        min_prompts=per[0].min_prompts,
    )


def best_assisted(speedups: pd.DataFrame, min_prompts: int) -> pd.Series | None:
    """The best assisted pair at the longest length with a speedup over ≥ ``min_prompts`` prompts, else (fewer
    prompts everywhere) at the longest length measured at all; None where nothing was."""
    d = speedups[speedups["method"] == "assisted"].dropna(subset=["speedup_median"]) if len(speedups) else speedups
    if d.empty:
        return None
    enough = d[d["prompts"] >= min_prompts]
    d = enough if len(enough) else d
    top = d[d["length"] == d["length"].max()]
    return top.loc[top["speedup_median"].idxmax()]


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The best assisted pair's median speedup over plain HF generate (see ``best_assisted``), with its setup."""
    if not runs.measured:
        return None
    r = report(runs)
    best = best_assisted(r.speedups, r.min_prompts)
    if best is None:
        return None
    n = int(best["prompts"])
    few = f"; {n} prompt{'s' if n != 1 else ''}, below the {r.min_prompts} a verdict needs" if n < r.min_prompts else ""
    return (
        f"{best['speedup_median']:.2f} ×",
        f"best assistant_model pair, {best['pair']}, at {int(best['length'])} output tokens, median over prompts{few}",
    )


def published(r: Study6Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, published_value(r.runs), r.device)


def alpha_sentence(real: pd.DataFrame) -> str:
    if real.empty:
        return ""
    best = real.loc[real["alpha"].idxmax()]
    parts = "; ".join(f"{r.draft} {r.alpha:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in real.itertuples())
    return (
        f"Greedy acceptance α on {int(best['prompts'])} held-out prompts (95% bootstrap interval over prompts): "
        f"{parts}. The best, {best['draft']}, emits {best['tokens_per_round']:.2f} tokens per target forward at "
        f"γ = {int(best['gamma'])}."
    )


def _prompts_said(best: pd.Series, min_prompts: int) -> str:
    """The prompts a pooled speedup rests on, each repeat's where they differ ("median of 7 prompts in each of 3
    repeats" read the fewest as every repeat's), and whether a repeat had fewer than the verdicts' rule needs."""
    n, k = int(best["prompts"]), int(best.get("n_repeats", 1) or 1)
    each = [int(x) for x in str(best.get("prompts_by_repeat", n)).split(", ")]
    if k == 1 or len(set(each)) == 1:
        said = f"median of {n} prompt{'s' if n != 1 else ''}" + (f" in each of {k} repeats" if k > 1 else "")
    else:
        said = f"median over {', '.join(map(str, each[:-1]))} and {each[-1]} prompts in the {k} repeats"
    said += ", then the median over repeats" if k > 1 else ""
    below = sum(x < min_prompts for x in each)
    if below:
        which = "" if k == 1 else ("one repeat had " if below == 1 else f"{below} repeats had ")
        said += f"; {which}fewer than the {min_prompts} prompts a verdict's point needs"
    return said


def speed_sentence(speedups: pd.DataFrame, method: str, min_prompts: int = verdicts.MIN_PROMPTS) -> str:
    d = speedups[speedups["method"] == method] if len(speedups) else speedups
    if d.empty:
        return ""
    top = d[d["length"] == d["length"].max()]
    best = top.loc[top["speedup_median"].idxmax()]
    return (
        f"{METHOD_LABELS.get(method, method)}: best {best['pair']} at {int(best['length'])} tokens, "
        f"{best['speedup_median']:.2f}× {BASELINES.get(method, HF_BASELINE)} ({_prompts_said(best, min_prompts)})."
    )


def own_sentence(r: Study6Page) -> str:
    """The engine's speculation over the same engine running the target alone, and why that is not the ratio of
    the speedup table's two rows over HF: each prompt's ratio is taken first, and each row is its own median ("0.89×"
    stood beside rows of 17.96× and 18.38×, whose ratio is 0.98)."""
    said = speed_sentence(r.own_vs_engine, "own", r.min_prompts)
    if not said:
        return said
    d = r.own_vs_engine
    top = d[d["length"] == d["length"].max()]
    best = top.loc[top["speedup_median"].idxmax()]
    hf = r.speedups[r.speedups["length"] == best["length"]] if len(r.speedups) else r.speedups
    own = hf[(hf["method"] == "own") & (hf["pair"] == best["pair"])]
    alone = hf[(hf["method"] == "own_plain") & (hf["pair"] == best["target"])]
    if own.empty or alone.empty:
        return said
    a, b = float(own["speedup_median"].iloc[0]), float(alone["speedup_median"].iloc[0])
    return said[:-1] + (
        f"; this is each prompt's ratio of the two engine times, its median, not the ratio of the table's two rows "
        f"over {HF_BASELINE} ({a:.2f}× and {b:.2f}×, each its own median: {a / b:.2f})."
    )


def thin_sentence(r: Study6Page) -> str:
    """How many prompts each point rests on, against the rules' minimum."""
    if r.speedups.empty:
        return ""
    most = int(r.speedups["prompts"].max())
    if most >= r.min_prompts:
        return ""
    return (
        f"Every speedup here rests on at most {most} prompt{'s' if most != 1 else ''} per point; today's rules count "
        f"a point only over at least {r.min_prompts}, so no verdict can be drawn from this run."
    )


def takeaways(r: Study6Page) -> str:
    """One sentence per claim, then how thin the data is, α, prompt lookup and the engine."""
    return takeaway_list(
        [finding_sentence(f) for f in r.findings]
        + [
            thin_sentence(r),
            speed_sentence(r.speedups, "assisted", r.min_prompts),
            alpha_sentence(r.real_alpha),
            speed_sentence(r.speedups, "prompt_lookup", r.min_prompts),
            own_sentence(r),
        ]
    )


def speedup_view(r: Study6Page) -> pd.DataFrame:
    """Per method and pair at the longest length: median speedup, quartiles and prompts (the fewest any repeat had,
    as the takeaways say)."""
    d = r.speedups
    if d.empty:
        return pd.DataFrame()
    top = d[d["length"] == d["length"].max()]
    out = top.assign(method=top["method"].map(METHOD_LABELS).fillna(top["method"]))
    cols = {"speedup_median": "median (×)", "speedup_p25": "p25 (×)", "speedup_p75": "p75 (×)", "length": "tokens",
            "prompts": "prompts (fewest in a repeat)"}  # fmt: skip
    return (
        out[["method", "pair", "length", "speedup_median", "speedup_p25", "speedup_p75", "prompts"]]
        .rename(columns=cols)
        .round(2)
        .astype({cols["prompts"]: int})
        .reset_index(drop=True)
    )


def cost_view(r: Study6Page) -> pd.DataFrame:
    d = r.costs
    if d.empty:
        return pd.DataFrame()
    return (
        d.assign(params_m=d["params"] / 1e6, layers=d["layers"].astype(int), prompts=d["prompts"].astype(int))[
            ["model", "params_m", "layers", "ms_per_token", "prompts"]
        ]
        .rename(columns={"params_m": "params (M)", "ms_per_token": "decode (ms/token)"})
        .round(2)
    )


def alpha_view(r: Study6Page) -> pd.DataFrame:
    """Per draft: kind, α and its interval, prompts, tokens per target forward."""
    a = r.real_alpha
    if a.empty:
        p = r.pairs.drop_duplicates("pair") if len(r.pairs) else r.pairs
        return p[["pair", "alpha"]].round(3).reset_index(drop=True) if len(p) else pd.DataFrame()
    cols = {"draft": "draft", "kind": "kind", "alpha": "α", "ci_low": "α, 95% CI low", "ci_high": "α, 95% CI high",
            "prompts": "prompts", "tokens_per_round": "tokens per target forward"}  # fmt: skip
    gamma = a["gamma"].dropna().unique() if "gamma" in a else []
    if len(gamma) == 1:
        cols["tokens_per_round"] += f" (γ = {int(gamma[0])})"
    return a[list(cols)].rename(columns=cols).round(3)


def method_names(methods: pd.Series) -> pd.Series:
    """The methods as the speedup table names them, plain HF generate included, in place of the runs' ids."""
    return methods.map({"plain": HF_BASELINE, **METHOD_LABELS}).fillna(methods)


def coverage_caption(r: Study6Page) -> str:
    """What the coverage table's numbers are: the fewest prompts in a repeat, as the speedup table's prompts and the
    rule read them."""
    return (
        "**What ran**: prompts per method and output length, the fewest any repeat measured at the method's "
        'least-measured pair (0: no pair measured there), as the speedup table\'s "prompts (fewest in a repeat)": a '
        f"point counts in a repeat's verdict only over at least {r.min_prompts} of that repeat's prompts (each "
        "repeat's counts: its times.csv):"
    )


def left_out(r: Study6Page) -> str:
    """The timed runs the sweep did not complete, over every repeat, counted by status and by reason (the reason's
    numbers dropped, so that "needs ≈16 s, 6 s left" and "needs ≈8 s, 2 s left" count as one)."""
    runs = r.runs.table("runs") if r.runs.measured else pd.DataFrame()
    if runs.empty or "status" not in runs:
        return ""
    bad = runs[runs["status"] != "ok"]
    if bad.empty:
        return f"Every one of the {len(runs):,} timed runs completed."
    statuses = bad["status"].value_counts()
    errors = bad["error"] if "error" in bad else pd.Series("not recorded", index=bad.index)
    why = errors.fillna("not recorded").astype(str).map(lambda e: re.sub(r":.*| after .*", "", e).strip())
    reasons = "; ".join(f"{w} ({n})" for w, n in why.value_counts().items())
    said = " and ".join(f"{n} {'cut short' if st == 'cut' else st}" for st, n in statuses.items())
    return f"Of the {len(runs):,} timed runs over every repeat, {said} did not complete. Why: {reasons}."


def coverage_view(r: Study6Page) -> pd.DataFrame:
    """Per method and output length, the fewest prompts any repeat measured at its least-measured pair among those
    measured at that length (0: none was), and how many pairs it ran: the rule's "prompts per point" at a glance. A
    draft's own plain runs stop at the cost length (they give its decode cost), so a minimum over every pair read 0
    plain prompts at 512 tokens beside the target's 9."""
    c = r.coverage.drop(columns=["n_repeats"], errors="ignore")
    if c.empty:
        return c
    counts = [k for k in c.columns if k not in ("method", "pair")]
    g = c.groupby("method", sort=False)
    least = g[counts].agg(lambda v: int(v.min()) if v.notna().any() else 0)
    out = least.join(g["pair"].nunique().rename("pairs")).reset_index()
    return out.assign(method=method_names(out["method"])).rename(columns={k: f"{k} tok" for k in counts})


def match_view(r: Study6Page) -> pd.DataFrame | str:
    """Per method and pair, over every repeat's runs: how many runs' tokens equal plain greedy ``generate``'s, their
    share of the runs, and the mean share of tokens made before the first difference (percent)."""
    m = r.match_rates
    if m.empty:
        return "No run recorded its output against plain greedy."
    out = m.assign(
        method=method_names(m["method"]),
        exact=100 * m["exact_match_rate"],
        equal=(m["exact_match_rate"] * m["runs"]).round().astype(int),
        prefix=100 * m["matching_prefix_mean"],
        runs=m["runs"].astype(int),
    )
    cols = {"method": "method", "pair": "pair", "runs": "runs", "equal": "equal to plain (runs)",
            "exact": "equal to plain (% of runs)", "prefix": "tokens before the first difference (mean %)"}  # fmt: skip
    return out[list(cols)].rename(columns=cols).round(1).reset_index(drop=True)


def engine_view(r: Study6Page) -> pd.DataFrame:
    d = r.own_vs_engine
    if d.empty:
        return d
    return d[d["length"] == d["length"].max()][["pair", "length", "speedup_median", "prompts"]].round(2)


DISTILL_COLUMNS = {"draft": "draft", "layers": "layers", "steps": "steps", "tokens_seen": "tokens seen",
                   "train_s": "training (s)", "first_loss": "loss, first 20 steps", "last_loss": "loss, last 20 steps",
                   "cached": "loaded from cache"}  # fmt: skip


def distill_view(r: Study6Page) -> pd.DataFrame | str:
    d = r.distill
    if d.empty:
        return ""
    out = d[[c for c in DISTILL_COLUMNS if c in d]].round(2)
    out = out.assign(**{c: out[c].map(lambda x: f"{int(x):,}") for c in ("steps", "tokens_seen") if c in out})
    if "cached" in out:
        out = out.assign(cached=out["cached"].map({True: "yes", False: "no"}).fillna(out["cached"]))
    return out.rename(columns=DISTILL_COLUMNS)


def distill_caption(r: Study6Page) -> str:
    """The drafts' training, and why the deeper draft's near-zero loss does not make it the better draft: it saw its
    training answers many times over and fits them almost exactly, yet agrees with the target less often on held-out
    prompts than the shallower draft, whose loss stayed high."""
    d, a = r.distill, r.real_alpha
    head = "**Draft training** (one run's, before the study's clock; each part trains or loads the same recipe):"
    if d.empty or a.empty or not {"last_loss", "tokens_seen", "tokens"} <= set(d.columns) or len(d) < 2:
        return head if not d.empty else ""
    alpha = a.set_index("draft")["alpha"]
    d = d[d["draft"].isin(alpha.index)].sort_values("last_loss")
    if len(d) < 2:
        return head
    low, high = d.iloc[0], d.iloc[-1]
    if alpha[low["draft"]] >= alpha[high["draft"]]:
        return head
    passes = low["tokens_seen"] / low["tokens"]
    return (
        f"{head} {low['draft']} saw {low['tokens_seen'] / 1e6:.1f} million tokens, about {passes:.0f} passes over "
        f"its {int(low['tokens']):,} tokens of training answers, and ends at a loss of {low['last_loss']:.2f} against "
        f"{high['draft']}'s {high['last_loss']:.2f}; yet on held-out prompts it agrees with the target less often (α "
        f"{alpha[low['draft']]:.2f} against {alpha[high['draft']]:.2f}). A loss that low suggests it memorised those "
        "answers rather than learning more of the target's behaviour on new prompts."
    )
