"""Study 1's reporting path: everything its page shows, computed from the runs' files (``report``), and the page text.

From each repeat's raw tables (``requests``, ``points``; the legacy run's ``summary`` stands in for ``points``, its
statistics ignored) it recomputes every point's summary: latency percentiles, the worst-stall statistic (the p99 of
the per-request maximum ITL, with its bootstrap interval), delivered throughput, cut requests. From the summaries:
the capacity at the ITL SLO per setting (``capacity``), each repeat's verdicts by today's rules (``verdicts``),
and the tables and figures (each point's median over repeats).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from servelab.loadgen.metrics import SUMMARY_KEYS, run_span_s, summarize_metrics
from servelab.loadgen.run import DEADLINE_ERROR
from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.tested_on import model_name
from servelab.studies.s01_scheduling import verdicts
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.measure import PARTS
from servelab.studies.s01_scheduling.stall import p99_of_max_itl

STUDY = "01_scheduling"
# every claim compares settings measured in different parts: a repeat judges them once all its parts ran
NEEDS = {fid: tuple(PARTS) for fid in ("F1.1", "F1.2", "F1.3")}
KEYS = ["model", "scheduler", "budget", "rate_fraction", "sweep"]  # one load point
RAW_POINT = [
    "rate",
    "status",
    "attempts",
    "min_requests",
    "window_s",
    "deadline_s",
    "duration_s",
    "slo_itl_ms",
    "warmup_ms",
]


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

    @property
    def device(self) -> str:
        return self.runs.device_name

    @property
    def mid_fraction(self) -> float | None:
        fr = self.P.get("rate_fractions") or []
        return sorted(fr)[len(fr) // 2] if fr else None


# ---- from raw tables to summaries ---------------------------------------------------------------------------------


def points_table(rep: RunSet) -> pd.DataFrame:
    """The load points of one repeat (or of several): ``points.csv``, or the legacy run's ``summary.csv`` reduced
    to its raw columns (its statistics are recomputed from its requests, never read)."""
    pts = rep.table("points")
    if pts.empty:
        pts = rep.table("summary")
    if pts.empty:
        return pts
    keep = ["repeat", "part", *KEYS, *RAW_POINT]
    pts = pts.reindex(columns=[c for c in keep if c in pts.columns or c in RAW_POINT])
    pts["attempts"] = pts["attempts"].fillna(1)
    return pts


def _is_cut(error: pd.Series) -> pd.Series:
    return error.fillna("").astype(str) == DEADLINE_ERROR


def _token_times(values) -> tuple[np.ndarray, np.ndarray]:
    """Every request's token times (lists, or their CSV text: JSON lists) flattened in request order, and each
    request's count. The CSV text is parsed in one pass, each number by ``float`` as ``json`` would."""
    vals = list(values)
    counts = np.zeros(len(vals), dtype=np.int64)
    parts: list[str] = []
    arrays: list[np.ndarray] = []
    for i, v in enumerate(vals):
        if isinstance(v, str):
            inner = v.strip()[1:-1].strip()
            if inner:
                counts[i] = inner.count(",") + 1
                parts.append(inner)
        elif v is not None and not (isinstance(v, float) and v != v):
            a = np.asarray(v, dtype=float)
            counts[i] = a.size
            if parts:  # mixed text and lists: keep the order
                arrays.append(np.fromiter(map(float, ",".join(parts).split(",")), float))
                parts = []
            arrays.append(a)
    if parts:
        arrays.append(np.fromiter(map(float, ",".join(parts).split(",")), float))
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return flat, counts


METRIC_COLUMNS = [
    "request_id",
    "ok",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "max_itl_ms",
    "itl",
    "queue_lag_ms",
]


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """``loadgen.metrics.request_metrics`` of every request at once (the same columns and numbers, vectorised), beside
    each request's point columns (``repeat``, the keys, ``rate``), its ``cut`` flag, its token count and span
    (``tokens``, ``last_token_s``), and ``sent_s``/``finish_s``: one parse of ``token_times_s`` serves the summaries,
    the verdicts and the figures."""
    if requests.empty:
        return pd.DataFrame(columns=METRIC_COLUMNS)
    n = len(requests)
    flat, counts = _token_times(requests["token_times_s"])
    ok = requests["ok"].astype(bool).to_numpy()
    sent = requests["sent_s"].to_numpy(dtype=float)
    first = requests["first_token_s"].to_numpy(dtype=float)
    finish = requests["finish_s"].to_numpy(dtype=float)
    out_tok = requests["output_tokens"].to_numpy(dtype=float)
    ttft = np.where(ok, (first - sent) * 1e3, np.nan)
    e2e = np.where(ok, (finish - sent) * 1e3, np.nan)
    n_out = np.where(ok, np.nan_to_num(out_tok), 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (n_out > 1), (e2e - ttft) / (n_out - 1), np.nan)
    owner = np.repeat(np.arange(n), counts)  # the request of each token
    same = owner[:-1] == owner[1:]
    gap_owner = owner[:-1][same]
    gaps = (np.diff(flat) * 1e3)[same]
    keep = ok[gap_owner]  # a failed request keeps no gaps, as request_metrics
    gaps, gap_owner = gaps[keep], gap_owner[keep]
    n_gaps = np.bincount(gap_owner, minlength=n)
    max_itl = np.full(n, np.nan)
    has = n_gaps > 0
    if has.any():
        starts = np.concatenate([[0], np.cumsum(n_gaps)[:-1]])
        max_itl[has] = np.maximum.reduceat(gaps, starts[has])
    last = np.full(n, np.nan)
    nonempty = counts > 0
    if nonempty.any():
        ends = np.cumsum(counts) - 1
        last[nonempty] = flat[ends[nonempty]]
    point_cols = [c for c in ("repeat", "part", *KEYS, "rate") if c in requests.columns]
    m = requests[point_cols].reset_index(drop=True)
    m = m.assign(
        request_id=requests["request_id"].to_numpy(),
        ok=ok,
        prompt_tokens=requests["prompt_tokens"].to_numpy(),
        output_tokens=requests["output_tokens"].to_numpy(),
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=e2e,
        max_itl_ms=max_itl,
        itl=_objects(np.split(gaps, np.cumsum(n_gaps)[:-1])),
        queue_lag_ms=(sent - requests["arrival_s"].to_numpy(dtype=float)) * 1e3,
        cut=_is_cut(requests["error"]).to_numpy() if "error" in requests else False,
        tokens=counts,
        last_token_s=last,
        sent_s=sent,
        finish_s=finish,
    )
    return m


def _objects(items: list) -> np.ndarray:
    """A 1-d object array of ``items`` (arrays of equal length stay one per cell)."""
    out = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        out[i] = x
    return out


def point_summary(m: pd.DataFrame, slo_itl_ms: float | None, seed: int = 0) -> dict:
    """One point's statistics from its rows of ``request_table`` (or from its raw request records): what
    ``loadgen.metrics.summarize`` gives, the worst-stall statistic, mean TTFT, delivered throughput, cut requests."""
    if "token_times_s" in m.columns:
        m = request_table(m)
    slo = slo_itl_ms if slo_itl_ms is not None and slo_itl_ms == slo_itl_ms and slo_itl_ms > 0 else None
    okm = m["ok"].to_numpy(dtype=bool)
    ok = m[okm]
    itl = np.concatenate(list(ok["itl"])) if len(ok) else np.zeros(0)
    span_run = run_span_s(m["sent_s"], m["finish_s"], okm)
    s = summarize_metrics(m, itl, duration_s=span_run, slo_tpot_ms=slo)
    tokens = int(m["tokens"].sum())
    span = float(m["last_token_s"].max() - m["sent_s"].min()) if tokens else float("nan")
    return {
        **{k: s[k] for k in SUMMARY_KEYS},
        "requests": len(m),
        "cut": int(m["cut"].sum()),
        **p99_of_max_itl(ok["max_itl_ms"], seed=seed),
        "mean_ttft_ms": float(ok["ttft_ms"].mean()) if len(ok) else float("nan"),
        "delivered_tok_s": tokens / span if tokens and span > 0 else float("nan"),
        "max_lag_ms": float(m["queue_lag_ms"].max()) if len(m) else float("nan"),
    }


def summary_table(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Every point of ``points`` with its statistics recomputed from ``requests`` (raw records, or their
    ``request_table``; a point none of whose requests are there keeps its raw columns, statistics NaN);
    ``shortfall``: requests short of ``min_requests``."""
    if points.empty:
        return points
    m = request_table(requests) if "token_times_s" in requests.columns else requests
    group = [c for c in ("repeat", *KEYS) if c in points.columns and c in m.columns]
    by = {k: g for k, g in m.groupby(group, sort=False)} if not m.empty else {}
    rows = []
    for p in points.to_dict("records"):
        g = by.get(tuple(p[c] for c in group))
        if p["status"] == "ok" and g is not None and len(g):
            p.update(point_summary(g, p.get("slo_itl_ms")))
        rows.append(p)
    out = pd.DataFrame(rows)
    if "completed" in out and "min_requests" in out:
        out["shortfall"] = (out["min_requests"] - out["completed"]).clip(lower=0)
    return out


def repeat_summary(rep: RunSet) -> pd.DataFrame:
    return summary_table(points_table(rep), rep.table("requests"))


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
    first = runs.repeat(runs.repeats[0])
    per_req = metrics[metrics["repeat"] == runs.repeats[0]] if "repeat" in metrics else metrics
    return Study1Page(
        runs,
        findings,
        pool_repeats(summary, KEYS) if not summary.empty else summary,
        pool_capacity(capacity),
        _with_setting(per_req.reset_index(drop=True)),
        first.table("steps"),
        first.table("probes"),
        skipped_points(points),
        dict(runs.params),
    )


def pool_capacity(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per setting over repeats: the median capacity and first missing rate, the bound where all agree."""
    if capacity.empty or "repeat" not in capacity:
        return capacity
    keys = ["model", "scheduler", "budget"]
    out = pool_repeats(capacity, keys)
    bounds = capacity.groupby(keys, sort=False)["bound"].agg(lambda b: b.iloc[0] if b.nunique() == 1 else "differs")
    return out.drop(columns=["bound"]).merge(bounds.reset_index(), on=keys)


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
    return f"{r['capacity_req_s']:.3g} req/s (missed at {r['first_miss_rate']:.3g})"


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
        out.append(
            f"{name}: the highest capacity at p99 ITL ≤ {best['slo_itl_ms']:.1f} ms is {_setting(best)}'s, "
            f"{capacity_text(best)}."
        )
    return out


def takeaways(r: Study1Page) -> str:
    """One sentence per claim, then the capacity at the SLO per model."""
    return takeaway_list([finding_sentence(f) for f in r.findings] + [" ".join(capacity_sentences(r.capacity))])


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
        f"{model_name(r['model'])}, {_setting(r)} at {r['rate']:.2f} req/s ({r['sweep']}): {r['completed']:.0f} "
        f"completed of {r['min_requests']:.0f} wanted"
        for _, r in s.iterrows()
    ]
    return f"{len(s)} of {len(ok)} measured points fell short of their `min_requests`:\n\n" + takeaway_list(lines)


def skipped_lines(skipped: pd.DataFrame) -> str:
    """The points a run planned and did not measure, or that every planned point was measured."""
    if skipped.empty:
        return "Every planned point was measured."
    lines = [
        f"repeat {r['repeat']}: {model_name(r['model'])}, {_setting(r)}, {r['sweep']} sweep at rate fraction "
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


def published_value_from(cap: pd.DataFrame) -> tuple[str, str]:
    parts = []
    for model, g in cap.groupby("model", sort=False):
        best = _best(g)
        eager = g[g["scheduler"] == "eager_cont_batch"]
        e = capacity_text(eager.iloc[0]) if len(eager) else "not measured"
        parts.append(f"{model.split(':')[-1]}: {_setting(best)} {capacity_text(best)}, EagerContBatch {e}")
    return "; ".join(parts), "capacity at the ITL SLO (Study 1)"
