"""Study 1's reporting path: everything its page shows, computed from the runs' files (``report``), and the page text.

From each repeat's raw tables it recomputes every point's summary (``summary.py``: latency percentiles, the
worst-stall statistic, delivered throughput, cut requests). From the summaries: the capacity at the ITL SLO per
setting (``capacity``), each repeat's verdicts by today's rules (``verdicts``), and the tables and figures (each
point's median over repeats).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.tested_on import model_name
from servelab.studies.s01_scheduling import verdicts
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.host_stalls import HOST_STALL_MS, host_stalls
from servelab.studies.s01_scheduling.measure import PART_SELECTORS, PARTS
from servelab.studies.s01_scheduling.params import DEFAULTS
from servelab.studies.s01_scheduling.step_costs import step_costs
from servelab.studies.s01_scheduling.summary import KEYS, points_table, repeat_summary, request_table, summary_table

STUDY = "01_scheduling"


def parts_holding(*settings: str) -> tuple[str, ...]:
    """The full profile's parts that measure any of ``settings`` (a selector without its model: "fcfs",
    "chunked_prefill@512"; FCFS on the 8B shape is split by rate, so "fcfs" takes each of its rate parts)."""
    return tuple(
        part for part, selectors in PART_SELECTORS.items() if any(sel.split("/")[1] in settings for sel in selectors)
    )


# Every claim compares settings measured in different parts, so a repeat judges it once the parts holding the
# settings its rule reads all ran: F1.1 and F1.2 pair EagerContBatch with ChunkedPrefill at the reference budget
# (``verdicts.paired``); F1.3 ranks every policy setting of the rate sweep. The budget sweep's parts enter no claim.
REFERENCE_BUDGET = DEFAULTS["full"]["reference_budget"]
_PAIRED = parts_holding("eager_cont_batch", f"chunked_prefill@{REFERENCE_BUDGET}")
_BUDGET_SWEEP = tuple(p for p, sels in PART_SELECTORS.items() if all("/budget@" in s for s in sels))
_RATE_SWEEP = tuple(p for p in PART_SELECTORS if p not in _BUDGET_SWEEP)
NEEDS = {"F1.1": _PAIRED, "F1.2": _PAIRED, "F1.3": _RATE_SWEEP}


@dataclass
class Study1Page:
    runs: RunSet
    findings: list[Finding]
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)  # every point, median over repeats
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)  # per setting, median over repeats
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)  # per-request metrics of the first repeat
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # the step log of the first repeat
    probes: pd.DataFrame = field(default_factory=pd.DataFrame)
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)  # points a run did not measure, and why
    P: dict = field(default_factory=dict)
    # steps of every repeat held up on the host (``host_stalls``), with their point's worst stall in that repeat
    stalls: pd.DataFrame = field(default_factory=pd.DataFrame)
    # points of every repeat whose trace ran past the run's deadline (``summary.offered``), one row each
    late: pd.DataFrame = field(default_factory=pd.DataFrame)
    # F1.1's and F1.2's verdict per model in every repeat, as a sentence (``verdicts.models_over_repeats``)
    per_model: dict = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.runs.device_name

    @property
    def mid_fraction(self) -> float | None:
        fr = self.P.get("rate_fractions") or []
        return sorted(fr)[len(fr) // 2] if fr else None


def _reference_budget(rep: RunSet) -> int:
    return int(rep.params.get("reference_budget", 512))


def repeat_findings(rep: RunSet) -> list[Finding]:
    """F1.1–F1.3 by today's rules from one repeat's requests and points."""
    return verdicts.findings(repeat_summary(rep), _reference_budget(rep), rep.params.get("dtype"))


def capacity_of(summary: pd.DataFrame) -> pd.DataFrame:
    """The capacity at the ITL SLO of one repeat's summary (rate sweep and capacity search together)."""
    if summary.empty or "itl_p99_ms" not in summary:
        return capacity_table(pd.DataFrame())
    s = summary[summary["sweep"].isin(["rate", "search"])].assign(sweep="rate")
    return capacity_table(s)


def skipped_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points a run planned and did not measure (time budget, errors), per repeat."""
    if points.empty:
        return points
    s = points[points["status"].astype(str) != "ok"]
    cols = [c for c in ("repeat", *KEYS, "rate", "status") if c in s.columns]
    return s[cols].reset_index(drop=True)


def report(runs: RunSet) -> Study1Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty). Each
    repeat's requests are parsed once (``request_table``): its summary feeds its verdicts and its capacity, and the
    first repeat's per-request metrics feed the distributions."""
    if not runs.measured:
        return Study1Page(runs, not_measured(STUDY))
    metrics = request_table(runs.table("requests"))
    points = points_table(runs)
    by_repeat = {}
    for k in runs.repeats:
        pts = points[points["repeat"] == k] if not points.empty else points
        req = metrics[metrics["repeat"] == k] if "repeat" in metrics else metrics
        by_repeat[k] = summary_table(pts.reset_index(drop=True), req)
    findings = runs.combined(
        lambda rep: verdicts.findings(by_repeat[rep.repeats[0]], _reference_budget(rep), rep.params.get("dtype")),
        needs=NEEDS,
    )
    summaries = [s.assign(repeat=k) for k, s in by_repeat.items() if not s.empty]
    caps = [capacity_of(s).assign(repeat=k) for k, s in by_repeat.items() if not s.empty]
    summary = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    capacity = pd.concat(caps, ignore_index=True) if caps else pd.DataFrame()
    stalls = named_repeats(with_point_stall(host_stalls(runs.table("steps")), summary), runs)
    findings, per_model = with_models_over_repeats(findings, runs, by_repeat, stalls)
    first = runs.repeat(runs.repeats[0])
    per_req = metrics[metrics["repeat"] == runs.repeats[0]] if "repeat" in metrics else metrics
    late = summary[summary["not_offered"].fillna(0) > 0] if "not_offered" in summary else summary.iloc[0:0]
    return Study1Page(
        runs,
        findings,
        pool_repeats(summary, KEYS) if not summary.empty else summary,
        pool_capacity(capacity),
        _with_setting(per_req.reset_index(drop=True)),
        first.table("steps"),
        first.table("probes"),
        named_repeats(skipped_points(points), runs),
        dict(runs.params),
        stalls,
        named_repeats(late.reset_index(drop=True), runs),
        per_model,
    )


def named_repeats(table: pd.DataFrame, runs: RunSet) -> pd.DataFrame:
    """``table`` with ``repeat_name``: how the page names each row's repeat ("repeat 1 of 3", as the findings'
    labels do, not by the data's 0-based ``repeat`` id, which stays as it is)."""
    if "repeat" not in table:
        return table
    return table.assign(repeat_name=[runs.repeat_name(k) for k in table["repeat"]])


def with_models_over_repeats(
    findings: list[Finding], runs: RunSet, by_repeat: dict, stalls: pd.DataFrame | None = None
) -> tuple[list[Finding], dict[str, str]]:
    """F1.1 and F1.2 are judged per model, then over the models; their notes gain each model's verdict in every
    repeat that judged them (``verdicts.models_over_repeats``), so a model whose repeats disagree under a claim
    whose repeats agree is in plain sight, and any step held up on the host (``stalls``) that set a judged point's
    worst stall in such a model's repeat (``held_up_sentence``). Also returns those sentences by claim, for the
    page's takeaways."""
    judged = [rep for rep in runs.per_repeat() if rep.has_parts(_PAIRED)]  # F1.1 and F1.2 read the same parts
    per_repeat = [verdicts.model_verdicts(by_repeat[rep.repeats[0]], _reference_budget(rep)) for rep in judged]
    stalls = pd.DataFrame() if stalls is None else stalls
    held = [
        paired_host_stalls(stalls, by_repeat[rep.repeats[0]], rep.repeats[0], _reference_budget(rep)) for rep in judged
    ]
    out, said = [], {}
    for f in findings:
        sentence = ""
        if f.id in ("F1.1", "F1.2"):
            claim = [p[f.id] for p in per_repeat]
            sentence = verdicts.models_over_repeats(claim) + held_up_sentence(claim, held)
        if sentence and f.repeats > 1:
            label = verdicts.split_label(claim)
            f = replace(f, note=f"{f.note}. {sentence}", measured_value=f.measured_value + label)
            said[f.id] = sentence
        out.append(f)
    return out, said


def sets_point_stall(stalls: pd.DataFrame) -> pd.Series:
    """Whether each step held up on the host set its point's worst stall in that repeat (within 5% of it)."""
    if "point_stall_ms" not in stalls:
        return pd.Series(False, index=stalls.index)
    return (stalls["step_ms"] - stalls["point_stall_ms"]).abs() <= 0.05 * stalls["point_stall_ms"]


def paired_host_stalls(stalls: pd.DataFrame, summary: pd.DataFrame, repeat, budget: int) -> pd.DataFrame:
    """The steps of repeat ``repeat`` held up on the host (``stalls``, with ``with_point_stall``'s column) that set
    the worst stall of a point F1.1 and F1.2 judge in that repeat's ``summary`` (``verdicts.judged_pairs``:
    EagerContBatch, or ChunkedPrefill at ``budget``, at a rate both served); one per point."""
    if stalls.empty or "point_stall_ms" not in stalls:
        return pd.DataFrame()
    pairs = verdicts.judged_pairs(summary, budget)[["model", "rate_fraction"]]
    setting = (stalls["scheduler"] == "eager_cont_batch") | (
        (stalls["scheduler"] == "chunked_prefill") & (stalls["budget"] == budget)
    )
    s = stalls[(stalls["repeat"] == repeat) & (stalls["sweep"] == "rate") & setting & sets_point_stall(stalls)]
    s = s.sort_values("host_ms", ascending=False).drop_duplicates(["model", "scheduler", "budget", "rate_fraction"])
    return s.merge(pairs, on=["model", "rate_fraction"])


def held_up_sentence(claim: list[dict[str, str]], held: list[pd.DataFrame]) -> str:
    """For a model whose repeats disagree (``verdicts.split_models`` of one claim's per-model verdicts, in run
    order): each repeat in which a step held up on the host set a judged point's worst stall (``held``, that repeat's
    ``paired_host_stalls`` of the ``named_repeats`` stalls), as a sentence, or ""."""
    split = set(verdicts.split_models(claim))
    lines = []
    for said, steps in zip(claim, held, strict=True):
        for _, r in steps.iterrows():
            name = verdicts.short(r["model"])
            if name not in split:
                continue
            lines.append(
                f"{name} {said[name]} in {r['repeat_name']} (listed under *Steps held up on the host*), "
                f"where {_shown(r)}'s worst stall at rate fraction {r['rate_fraction']:g}, {r['point_stall_ms']:.1f} "
                f"ms, is set by one step held {r['host_ms']:.0f} ms on the host"
            )
    return "".join(f". {line}" for line in lines)


def with_point_stall(stalls: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``stalls`` with ``point_stall_ms``: the worst stall (the p99 of per-request maximum ITL) of the point each
    step belongs to, in the same repeat (``summary``: every repeat's points, with a ``repeat`` column)."""
    if stalls.empty or summary.empty or "max_itl_p99_ms" not in summary:
        return stalls
    keys = [k for k in ("repeat", *KEYS) if k in stalls.columns]
    point = summary[[*keys, "max_itl_p99_ms"]].drop_duplicates(keys)
    return stalls.merge(point.rename(columns={"max_itl_p99_ms": "point_stall_ms"}), on=keys, how="left")


def host_stall_lines(stalls: pd.DataFrame) -> str:
    """One line per step held up on the host (``host_stalls``, ``named_repeats``), with its point's worst stall in
    that repeat, or that there was none."""
    if stalls.empty:
        return f"No step of any repeat spent {HOST_STALL_MS:.0f} ms or more on the host."
    lines = []
    for _, r in stalls.iterrows():
        point = r.get("point_stall_ms")
        sets = (
            f"; that point's worst stall (p99 of per-request max ITL) in this repeat is {point:.1f} ms"
            if pd.notna(point)
            else ""
        )
        kind = r["kind"].replace(" ", "-")
        gc_ms = r.get("gc_ms")
        collector = f" ({gc_ms:.0f} ms of it in Python's garbage collector)" if pd.notna(gc_ms) else ""
        lines.append(
            f"{r['repeat_name']}: {model_name(r['model'])}, {_shown(r)}, {r['sweep']} sweep"
            f" at rate fraction {r['rate_fraction']:g}: a {kind} step ({r['prefill_tokens']:,.0f} prefill and "
            f"{r['decode_tokens']:,.0f} decode tokens) took {r['step_ms']:.0f} ms, {r['host_ms']:.0f} ms of it on the "
            f"host{collector}, where that setting's {kind} steps usually spend {r['usual_host_ms']:.2f} ms{sets}"
        )
    return (
        f"{len(stalls)} step{'s' if len(stalls) != 1 else ''} of the step logs spent {HOST_STALL_MS:.0f} ms or more "
        "on the host, at least ten times what that setting's steps of the same kind usually spend there. "
        "No scheduling decision takes that long: such a step waited on a one-off host event "
        "(a kernel compiled on first use, an allocation, a collection), and every decode in it waited too.\n\n"
        + takeaway_list(lines)
    )


def pool_capacity(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per setting over repeats: the median capacity and first missing rate, the bound where all agree."""
    if capacity.empty or "repeat" not in capacity:
        return capacity
    keys = ["model", "scheduler", "budget"]
    out = pool_repeats(capacity, keys)
    g = capacity.groupby(keys, sort=False)
    bounds = g["bound"].agg(lambda b: b.iloc[0] if b.nunique() == 1 else "differs")
    spread = g["capacity_req_s"].agg(["min", "max"]).rename(columns={"min": "capacity_lo", "max": "capacity_hi"})
    return out.drop(columns=["bound"]).merge(bounds.reset_index(), on=keys).merge(spread.reset_index(), on=keys)


def per_request(requests: pd.DataFrame) -> pd.DataFrame:
    """``request_metrics`` of every request, with its point's keys, its rate and its setting."""
    return _with_setting(request_table(requests))


def _with_setting(m: pd.DataFrame) -> pd.DataFrame:
    if m.empty or "scheduler" not in m:
        return pd.DataFrame() if m.empty else m
    return m.assign(setting=[_name(s, b) for s, b in zip(m["scheduler"], m["budget"], strict=True)])


# ---- page text ------------------------------------------------------------------------------------------------------


def _name(scheduler: str, budget) -> str:
    return f"{scheduler}@{int(budget)}" if scheduler == "chunked_prefill" else scheduler


def _setting(r) -> str:
    return _name(r["scheduler"], r["budget"])


def capacity_text(r) -> str:
    """A setting's capacity at the SLO as words: bracketed, a lower bound, or below the lowest rate measured."""
    if r["bound"] == "below lowest rate":
        return f"below the lowest rate measured ({r['lowest_rate']:.3g} req/s)"
    if r["bound"] == "at least highest rate":
        return f"at least {r['capacity_req_s']:.3g} req/s (the highest rate measured)"
    if r["bound"] == "differs":
        return f"{r['capacity_req_s']:.3g} req/s (median; the repeats bracket it differently)"
    lo, hi = r.get("capacity_lo"), r.get("capacity_hi")
    if pd.notna(lo) and pd.notna(hi) and lo != hi:  # each repeat bracketed it, not all at the same rates
        return (
            f"{r['capacity_req_s']:.3g} req/s (the median of the repeats' {lo:.3g}–{hi:.3g} req/s, each bracketed; "
            f"median first miss {r['first_miss_rate']:.3g} req/s)"
        )
    return f"{r['capacity_req_s']:.3g} req/s (missed at {r['first_miss_rate']:.3g} req/s)"


def capacity_sentences(capacity: pd.DataFrame) -> list[str]:
    """Per model: the setting with the highest capacity at the ITL SLO, or that none met it."""
    out = []
    if capacity.empty:
        return out
    for model, g in capacity.groupby("model", sort=False):
        best = _best(g)
        name = model_name(model)
        if not best["capacity_req_s"] > 0:
            out.append(
                f"{name}: no setting met p99 ITL ≤ {best['slo_itl_ms']:.1f} ms even at the lowest rate measured "
                f"({g['lowest_rate'].min():.3g} req/s)."
            )
            continue
        top = g[g["capacity_req_s"] == best["capacity_req_s"]]
        texts = [capacity_text(r) for _, r in top.iterrows()]
        if len(top) > 1:  # a tie is a tie: every setting in it (the published row says "tied" too)
            names = " and ".join(_shown(r) for _, r in top.iterrows())
            each = (
                texts[0]
                if len(set(texts)) == 1
                else "; ".join(f"{_shown(r)} {t}" for (_, r), t in zip(top.iterrows(), texts, strict=True))
            )
            out.append(
                f"{name}: {names} tie for the highest capacity at p99 ITL ≤ {best['slo_itl_ms']:.1f} ms, {each}."
            )
            continue
        out.append(
            f"{name}: the highest capacity at p99 ITL ≤ {best['slo_itl_ms']:.1f} ms is {_shown(best)}'s, "
            f"{capacity_text(best)}."
        )
    return out


def takeaways(r: Study1Page) -> str:
    """One sentence per claim, then the capacity at the SLO per model (said to rest on the parts measured so far,
    while some wait: a capacity bracket needs every rate of a setting, and FCFS on the 8B shape is split by rate)."""
    cap = " ".join(capacity_sentences(r.capacity))
    waits = [p for p in PARTS if p not in r.runs.parts] if r.runs.measured and not r.runs.has_parts(PARTS) else []
    if cap and waits:
        cap = f"From the parts measured so far ({', '.join(r.runs.parts)}), not yet {', '.join(waits)}: {cap}"
    claims = [
        finding_sentence(f) + (f" {r.per_model[f.id]}." if f.id in r.per_model else "") for f in r.findings
    ]  # fmt: skip
    return takeaway_list([*claims, cap, stall_takeaway(r.stalls)])


def stall_takeaway(stalls: pd.DataFrame) -> str:
    """The sentence that one-off host stalls are in the step logs and how many set their point's worst stall (a
    step within 5% of it), or "" where there are none."""
    if stalls.empty:
        return ""
    sets = int(sets_point_stall(stalls).sum())
    n = len(stalls)
    return (
        f"{n} engine step{'s' if n != 1 else ''} waited {HOST_STALL_MS:.0f} ms or more on the host, not on the "
        f"policy's work; {sets} of them set{'s its' if sets == 1 else ' their'} point's worst stall in that "
        "repeat (listed under *Steps held up on the host*)."
    )


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def method_numbers(runs: RunSet) -> str:
    """The sizes the Method names by parameter, as these runs recorded them (their ``run.json``), and each repeat's
    seed: the Method's prose is qualitative, and these numbers come from the runs, so that they cannot go stale."""
    if not runs.measured:
        return ""
    reps = runs.per_repeat()

    def value(key: str) -> str:
        got = dict.fromkeys(f"{v:g}" for rep in reps if isinstance(v := rep.params.get(key), int | float))
        return " or ".join(got) if got else "not recorded"

    seeds = [str(rep.params.get("seed", "?")) for rep in reps]
    names = runs.repeats_name(runs.repeats)
    return (
        f"In these runs a point is sized for {value('min_requests')} completed requests (`min_requests`) and a "
        f"searched point for {value('search_min_requests')} (`search_min_requests`); the search steps the rate by a "
        f"factor of {value('search_factor')} (`search_factor`), at most {value('search_steps')} times each way "
        f"(`search_steps`); {names} ran seed{'s' if len(seeds) > 1 else ''} {_listing(seeds)}."
    )


def probe_lines(probes: pd.DataFrame) -> str:
    """Each model's probe: decode iteration and prefill cost against their roofline floors, the capacity estimate."""
    lines = []
    for _, pr in probes.drop_duplicates("model").iterrows() if not probes.empty else []:
        name = model_name(pr["model"])
        if pr.get("status") != "ok" or pd.isna(pr.get("decode_floor_ms")):
            lines.append(f"{name}: probe {pr.get('status')}.")
            continue
        lines.append(
            f"{name}: decode iteration {pr['decode_step_s'] * 1e3:.2f} ms at batch {pr['decode_batch']:.0f} = "
            f"{pr['decode_pct_of_floor']:.1f}% of its roofline floor ({pr['decode_floor_ms']:.3f} ms, "
            f"{pr['decode_bound']}-bound); prefill {pr['prefill_s_per_token'] * 1e6:.1f} µs/token = "
            f"{pr['prefill_pct_of_floor']:.1f}% of its floor ({pr['prefill_floor_us_per_token']:.2f} µs/token, "
            f"{pr['prefill_bound']}-bound); capacity estimate {pr['capacity_req_s']:.2f} req/s."
        )
    return takeaway_list(lines) or "Not measured."


def capacity_view(capacity: pd.DataFrame) -> pd.DataFrame:
    """The capacity table with units in its headings, one row per model and setting."""
    if capacity.empty:
        return pd.DataFrame({"capacity": ["not measured"]})
    c = capacity.assign(
        model=capacity["model"].map(model_name),
        setting=capacity.apply(_setting, axis=1),
        capacity=capacity.apply(capacity_text, axis=1),
    )
    c = c[["model", "setting", "capacity", "slo_itl_ms", "lowest_rate", "highest_rate", "rates"]]
    return c.rename(
        columns={
            "capacity": "capacity at the SLO",
            "slo_itl_ms": "ITL SLO (ms)",
            "lowest_rate": "lowest rate (req/s)",
            "highest_rate": "highest rate (req/s)",
            "rates": "rates measured",
        }
    ).round(2)


def step_cost_view(steps: pd.DataFrame) -> pd.DataFrame:
    """What each kind of engine step cost in the first repeat's runs (``step_costs``), one row per model and setting:
    the median ms of its decode-only, mixed and prefill-only steps, the last two also as multiples of the decode-only
    step, with each kind's count and median tokens; the evidence under the stalls, from every server's step log."""
    if steps.empty:
        return pd.DataFrame()
    t = step_costs(steps, by=("model", "scheduler", "budget"))
    rows = []
    for (model, sched, budget), g in t.groupby(["model", "scheduler", "budget"], sort=False):
        row = {"model": model_name(model), "setting": _name(sched, budget)}
        for kind, k in g.set_index("kind").iterrows():
            times = f" ({k.x_decode_step:.1f}×)" if kind != "decode only" else ""
            row[f"{kind}: steps, median tokens"] = f"{int(k.steps):,}, {k.median_tokens:,.0f}"
            row[f"{kind}: median ms"] = f"{k.median_ms:.2f}{times}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("—")


def at_rate(table: pd.DataFrame, model: str, rate_fraction: float | None) -> bool:
    """Whether ``table`` (requests or steps) holds the rate sweep's point at ``rate_fraction`` for ``model``."""
    if table.empty or rate_fraction is None or not {"model", "sweep", "rate_fraction"} <= set(table.columns):
        return False
    return bool(
        ((table["model"] == model) & (table["sweep"] == "rate") & (table["rate_fraction"] == rate_fraction)).any()
    )


def not_at_rate(model: str, rate_fraction: float | None) -> str:
    """The line that stands for a figure of a model with no run at the middle rate yet."""
    return (
        f"*{model_name(model)}: no run at the middle rate ({rate_fraction:g}× the probe's capacity estimate) yet;"
        " `make gpu-plan` lists the jobs that measure it.*"
    )


def run_view(summary: pd.DataFrame, rate_fraction: float | None) -> pd.DataFrame:
    """Every setting's latencies and throughput at one rate fraction (median over repeats)."""
    if summary.empty or "max_itl_p99_ms" not in summary or rate_fraction is None:
        return pd.DataFrame({"": ["not measured"]})
    ok = (summary["status"] == "ok") & (summary["sweep"] == "rate")
    s = summary[ok & (summary["rate_fraction"] == rate_fraction)]
    s = s.assign(
        model=s["model"].map(model_name),
        setting=s.apply(_setting, axis=1),
        stall_ci=[f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s["max_itl_p99_lo_ms"], s["max_itl_p99_hi_ms"], strict=True)],
    )
    cols = {
        "rate": "rate (req/s)",
        "ttft_p50_ms": "TTFT p50 (ms)",
        "itl_p99_ms": "ITL p99 (ms)",
        "max_itl_p99_ms": "worst stall: p99 of per-request max (ms)",
        "stall_ci": "its 95% CI (ms)",
        "delivered_tok_s": "delivered (tok/s)",
        "completed": "completed",
        "cut": "cut",
    }
    return s[["model", "setting", *cols]].rename(columns=cols).round(1).reset_index(drop=True)


def shortfall_lines(summary: pd.DataFrame) -> str:
    """Every measured point that completed fewer than its ``min_requests`` (none hidden), or that none did."""
    if summary.empty or "shortfall" not in summary:
        return ""
    ok = summary[summary["status"] == "ok"]
    unsized = ok[ok["min_requests"].isna()]
    if len(unsized):  # the legacy run sized its points by a fixed window, not by min_requests
        return (
            f"{len(unsized)} of {len(ok)} measured points were sized by a fixed window, not for a number of completed "
            f"requests: they completed {unsized['completed'].min():.0f}–{unsized['completed'].max():.0f} requests "
            f"(median {unsized['completed'].median():.0f})."
        )
    s = ok[ok["shortfall"] > 0]
    if s.empty:
        return f"Every one of the {len(ok)} measured points completed at least its `min_requests` requests."
    lines = [
        f"{model_name(r['model'])}, {_shown(r)} at {r['rate']:.2f} req/s ({r['sweep']}): {r['completed']:.0f} "
        f"completed of {r['min_requests']:.0f} wanted"
        for _, r in s.iterrows()
    ]
    return f"{len(s)} of {len(ok)} measured points fell short of their `min_requests`:\n\n" + takeaway_list(lines)


def not_offered_lines(late: pd.DataFrame) -> str:
    """The points whose trace ran past the run's deadline (``summary.offered``, ``named_repeats``): how many requests
    each left out, or "" where none did."""
    if late.empty:
        return ""
    n = int(late["not_offered"].sum())
    lines = [
        f"{r['repeat_name']}: {model_name(r['model'])}, {_shown(r)}, {r['sweep']} sweep at {r['rate']:.2f} req/s: "
        f"{r['not_offered']:.0f} of {r['requests'] + r['not_offered']:.0f}"
        for _, r in late.iterrows()
    ]
    return (
        f"{n} requests of {len(late)} points' traces arrived after their run's deadline (the window plus the drain): "
        "a point replays as many arrivals as its window should hold, and Poisson arrivals can run past it. The load "
        "generator never sent them and recorded them as cut with no token; they were never offered, so each point "
        "leaves them out. Counted as cut, they made points miss the SLO where every request that "
        "was sent met it.\n\n" + takeaway_list(lines)
    )


def skipped_lines(skipped: pd.DataFrame) -> str:
    """The points a run planned and did not measure (``named_repeats``), or that every planned point was
    measured."""
    if skipped.empty:
        return "Every planned point was measured."
    lines = [
        f"{r['repeat_name']}: {model_name(r['model'])}, {_shown(r)}, {r['sweep']} sweep at rate fraction "
        f"{r['rate_fraction']:g}: {r['status']}"
        for _, r in skipped.iterrows()
    ]
    return f"{len(skipped)} planned points were not measured:\n\n" + takeaway_list(lines)


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The capacity at the ITL SLO: the best setting's and EagerContBatch's per model (median over repeats); None
    where nothing was measured."""
    cap = report_capacity(runs) if runs.measured else pd.DataFrame()
    return published_value_from(cap) if not cap.empty else None


def report_capacity(runs: RunSet) -> pd.DataFrame:
    caps = []
    for rep in runs.per_repeat():
        caps.append(capacity_of(repeat_summary(rep)).assign(repeat=rep.repeats[0]))
    return pool_capacity(pd.concat(caps, ignore_index=True)) if caps else pd.DataFrame()


def published(r: Study1Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    value = None
    if r.runs.measured and not r.capacity.empty:
        value = published_value_from(r.capacity)  # the page's pooled capacity, as published_value computes it
    return published_section(STUDY, value, r.device)


def _best(g: pd.DataFrame):
    """The setting with the highest capacity (NaN capacities, below the lowest rate, count as lowest)."""
    return g.loc[g["capacity_req_s"].fillna(-1.0).idxmax()]


SHOWN = verdicts.SHOWN  # the seed's names of the policies


def _shown(r) -> str:
    """A setting as the prose names it: ChunkedPrefill@512, EagerContBatch, FCFS."""
    return verdicts.seed_setting(r["scheduler"], r["budget"])


def published_value_from(cap: pd.DataFrame) -> tuple[str, str]:
    parts = []
    for model, g in cap.groupby("model", sort=False):
        best = _best(g)
        eager = g[g["scheduler"] == "eager_cont_batch"]
        e = capacity_text(eager.iloc[0]) if len(eager) else "not measured"
        short = model.split(":")[-1]
        top = g[g["capacity_req_s"].fillna(-1.0) == g["capacity_req_s"].fillna(-1.0).max()]
        if len(top) > 1:  # a tie: every setting in it
            names = " = ".join(_shown(r) for _, r in top.iterrows())
            parts.append(f"{short}: best {names} (tied), {capacity_text(best)}, EagerContBatch {e}")
        elif best["scheduler"] == "eager_cont_batch":  # the baseline is the best: name it once
            parts.append(f"{short}: best EagerContBatch itself, {e}")
        else:
            parts.append(f"{short}: best {_shown(best)} {capacity_text(best)}, EagerContBatch {e}")
    return "; ".join(parts), "capacity at the ITL SLO (Study 1)"
