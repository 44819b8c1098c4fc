"""Study 7's page: one run of every measurement (``run``), then one call per section of the notebook.

``run`` builds the engine, measures F7.1–F7.3 on it, simulates F7.4, serves the prefix workload over HTTP, judges
the claims and writes every table (``StudyResults``); the section functions show the tables and figures and
generate the takeaways from the run's numbers, so the notebook holds no analysis code and no typed number.
"""

from __future__ import annotations

import functools
import gc
import tempfile
from dataclasses import dataclass, field

import pandas as pd

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.budget import Budget
from servelab.studies.common.findings import Finding
from servelab.studies.common.page import finding_notes, rerun_recipe, show, takeaway_list, verdict_table
from servelab.studies.common.style import use_book_style
from servelab.studies.common.tested_on import model_tested_on
from servelab.studies.s07_prefix_cache import plots, verdicts
from servelab.studies.s07_prefix_cache.batch_sharing import batch_sharing_sweep, breakeven
from servelab.studies.s07_prefix_cache.cost_fit import prefill_costs, sharing_costs
from servelab.studies.s07_prefix_cache.multi_turn import build_conversation, multi_turn_sweep, turn_speedups
from servelab.studies.s07_prefix_cache.prefix_length import prefix_length_sweep, speedups
from servelab.studies.s07_prefix_cache.serving import ideal_hit_rate, prefix_trace, serve_comparison
from servelab.studies.s07_prefix_cache.simulate import hit_rates
from servelab.studies.s07_prefix_cache.study import build_engine
from servelab_book.published import render_published

SLUG = "07_prefix_cache"
SERVING_COLUMNS = [
    "load",
    "caching",
    "status",
    "completed",
    "failed",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "throughput_tok_s",
    "prompt_throughput_tok_s",
    "hit_rate_engine",
    "hit_rate_metrics",
    "ideal_hit_rate",
]


@dataclass
class Run:
    """Everything the page shows, from one run."""

    P: dict
    dev: object  # servelab.measure.device.DeviceRecord
    ceil: object  # servelab.measure.ceilings.Ceilings
    engine_stats: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # every table written, by its file name
    findings: list[Finding] = field(default_factory=list)
    serve_source: str = ""  # the server trace's description
    elapsed_s: float = 0.0  # wall time of the measurements

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    @property
    def model(self) -> str:
        return self.P["model"].replace("config:", "")


def _engine_parts(r: Run, engine, roof, budget: Budget) -> None:
    """F7.1–F7.3 on the engine, timed; every table into ``r.tables``."""
    P, t = r.P, r.tables
    kw = dict(warmup=P["warmup"], repeats=P["repeats"], budget=budget, progress=False)
    t["prefix_length"] = prefix_length_sweep(
        engine, P["prefix_lengths"], P["suffix_tokens"], roof, seed=P["seed"], **kw
    )
    t["prefix_length_speedup"] = speedups(t["prefix_length"])
    t["prefill_cost_fit"] = prefill_costs(t["prefix_length"])
    conversation = build_conversation(
        engine, P["turns"], P["system_tokens"], P["user_tokens"], P["reply_tokens"], seed=P["seed"]
    )
    t["multi_turn"] = multi_turn_sweep(engine, conversation, P["reply_tokens"], turn_repeats=P["turn_repeats"], **kw)
    t["multi_turn_speedup"] = turn_speedups(t["multi_turn"])
    t["batch_sharing"] = batch_sharing_sweep(
        engine, P["share_prefixes"], P["share_batches"], P["suffix_tokens"], roof, seed=P["seed"], **kw
    )
    t["batch_sharing_breakeven"] = breakeven(t["batch_sharing"])
    t["batch_sharing_cost_fit"] = sharing_costs(t["batch_sharing"])


def _serving(r: Run, engine, budget: Budget) -> None:
    """The server-level runs (caching off, then on; Poisson and burst) into ``r.tables``."""
    P = r.P
    workload = dict(
        n_prefixes=P["serve_prefixes"],
        alpha=P["serve_alpha"],
        prefix_tokens=P["serve_prefix_tokens"],
        suffix_tokens=P["serve_suffix_tokens"],
        output_tokens=P["serve_output_tokens"],
        vocab=engine.model.shape.vocab,
        seed=P["seed"],
    )
    poisson, keys = prefix_trace(P["serve_requests"], P["serve_rate"], **workload)
    burst, _ = prefix_trace(P["serve_requests"], float("inf"), **workload)
    r.serve_source = poisson.source
    prompt = P["serve_prefix_tokens"] + P["serve_suffix_tokens"]
    # the engine in a process of its own (built there from the same parameters), or this process's engine
    build = functools.partial(build_engine, P, r.dev.kind) if P["serve_engine_process"] else None
    req, summary = serve_comparison(
        engine,
        {"poisson": poisson, "burst": burst},
        tempfile.mkdtemp(),
        build=build,
        deadline_s=P["serve_deadline_s"],
        budget=budget,
        run_estimate_s=P["serve_run_estimate_s"],
        progress=False,
    )
    summary["ideal_hit_rate"] = ideal_hit_rate(keys, P["serve_prefix_tokens"], prompt, P["block_size"])
    r.tables["serving_requests"], r.tables["serving_summary"] = req, summary


def _judge(r: Run) -> list[Finding]:
    on = model_tested_on(r.P["model"], r.P["dtype"])
    return [
        verdicts.f71(r["prefix_length_speedup"], r["prefill_cost_fit"], tested_on=on),
        verdicts.f72(r["multi_turn_speedup"], tested_on=on),
        verdicts.f73(r["batch_sharing_breakeven"], r["batch_sharing_cost_fit"], tested_on=on),
        verdicts.f74(r["policy_hit_rates"], r.P["sim_prefixes"], r.P["sim_requests"]),
    ]


def run(P: dict) -> Run:
    """Measure everything the page shows, write every table and the findings, and finish the run record."""
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    dev = device_record()
    ceil = measure_ceilings()
    roof = Roofline.from_ceilings(ceil)
    res = StudyResults(SLUG, dev, P, ceil)
    budget = Budget(P["time_budget_s"])
    engine = build_engine(P, dev.kind)
    r = Run(P=P, dev=dev, ceil=ceil, engine_stats=engine.stats())
    _engine_parts(r, engine, roof, budget)
    r.tables["policy_hit_rates"] = hit_rates(
        P["sim_alphas"],
        P["sim_capacities"],
        P["sim_policies"],
        n_prefixes=P["sim_prefixes"],
        n_requests=P["sim_requests"],
        seed=P["seed"],
        progress=False,
    )
    if P["serve"] == "http":
        _serving(r, engine, budget)
    r.findings = _judge(r)
    r.elapsed_s = budget.elapsed_s()
    for name, df in r.tables.items():
        res.write(name, df)
    res.write_findings([f.row() for f in r.findings])
    del engine
    gc.collect()
    if dev.kind == "cuda":
        import torch

        torch.cuda.empty_cache()
    res.finish()
    return r


# ---- findings first --------------------------------------------------------------------------------------
def show_verdicts(r: Run) -> None:
    show(verdict_table(r.findings))


def takeaways(r: Run) -> str:
    """One sentence per claim, from its verdict and the rule's numbers, and one for the server runs."""
    said = [
        f"{f.id} {f.verdict}: this run {f.measured_value} against the RTX 2070's {f.seed_value}." for f in r.findings
    ]
    return takeaway_list([*said[:1], _floor_sentence(r), *said[1:], _serving_sentence(r)])


def show_takeaways(r: Run) -> None:
    show(takeaways(r))


def headline_figure(r: Run):
    """The one figure: time to first token against the shared prefix length, cached and uncached (F7.1)."""
    return plots.ttft_vs_prefix(
        r["prefix_length"],
        r["prefix_length_speedup"],
        f"{r.model} ({r.P['dtype']}) on {r.dev.name}: one request, prefix + {r.P['suffix_tokens']}-token question",
    )


def _floor_sentence(r: Run) -> str:
    ok = r["prefix_length"][r["prefix_length"]["status"] == "ok"]
    unc = ok[ok["mode"] == "uncached"]
    if unc.empty or "pct_of_floor" not in unc:
        return ""
    small, big = (
        unc[unc["prefix_tokens"] == unc["prefix_tokens"].min()],
        unc[unc["prefix_tokens"] == unc["prefix_tokens"].max()],
    )
    return (
        f"The uncached prefill reaches {big['pct_of_floor'].max():.0f}% of its roofline floor at "
        f"{int(big['prefix_tokens'].iloc[0]):,} tokens but only {small['pct_of_floor'].max():.1f}% at "
        f"{int(small['prefix_tokens'].iloc[0]):,}, where a forward costs its fixed overheads whatever the tokens: "
        "a cache can only save the part of the time that grows with the prefix."
    )


def _serving_sentence(r: Run) -> str:
    summary = r.tables.get("serving_summary")
    if summary is None or not (summary["status"] == "ok").all():
        return ""
    s = summary.set_index(["load", "caching"])
    parts = []
    for load in dict.fromkeys(summary["load"]):
        off, on = s.loc[(load, "off")], s.loc[(load, "on")]
        parts.append(
            f"{load}: median TTFT {off.ttft_p50_ms:.1f} → {on.ttft_p50_ms:.1f} ms "
            f"({off.ttft_p50_ms / on.ttft_p50_ms:.1f}×), p99 {off.ttft_p99_ms:.1f} → {on.ttft_p99_ms:.1f} ms, "
            f"output throughput {off.throughput_tok_s:,.0f} → {on.throughput_tok_s:,.0f} tokens/s, "
            f"hit rate {on.hit_rate_engine:.1%} (/metrics read {on.hit_rate_metrics:.1%}; "
            f"ideal {on.ideal_hit_rate:.1%})"
        )
    return "Serving with prefix caching off → on: " + "; ".join(parts) + "."


# ---- method and details -----------------------------------------------------------------------------------
def show_setup(r: Run) -> None:
    st, c = r.engine_stats, r.ceil
    show(
        f"Device: {r.dev.summary()}. Profile {r.P['profile']}; measured ceilings: copy {c.copy_gb_s:,.0f} GB/s "
        f"(read+write), {c.matmul_dtype} matmul {c.matmul_tflop_s:,.1f} TFLOP/s. Engine: {r.P['model']} "
        f"({r.P['dtype']}), {st['num_blocks']:,} KV blocks of {st['block_size']} tokens ({st['kv_pool_gib']:.2f} GiB), "
        f"attention {st['attention_backend']}, varlen prefill {st['varlen_prefill']}, {st['cuda_graphs']} CUDA "
        f"graphs; scheduler {st['scheduler']}, prefix eviction {r.P['eviction']}. The measurements took "
        f"{r.elapsed_s:.0f} s of wall time (budget {r.P['time_budget_s']:.0f} s)."
    )


def _statuses(df: pd.DataFrame) -> pd.DataFrame:
    return df["status"].value_counts().rename_axis("status").reset_index(name="points")


def show_prefix_length(r: Run) -> None:
    df = r["prefix_length"]
    values = ["median_ms", "step_ms", "computed_tokens", "pct_of_floor"]
    ok = (df["status"] == "ok").any()
    show(
        _statuses(df),
        df.pivot_table(index="prefix_tokens", columns="mode", values=values).round(2) if ok else None,
        r["prefix_length_speedup"].round(2),
        r["prefill_cost_fit"].round(4),
    )


def show_multi_turn(r: Run) -> None:
    ts = r["multi_turn_speedup"]
    show(
        _statuses(r["multi_turn"]),
        ts.pivot_table(index=["turn", "prompt_tokens"], columns="metric", values="speedup").round(2),
        plots.multi_turn(
            r["multi_turn"],
            ts,
            f"{r.model} on {r.dev.name}: {r.P['turns']} turns, {r.P['user_tokens']}-token messages, "
            f"{r.P['reply_tokens']}-token replies",
        ),
    )


def show_batch_sharing(r: Run) -> None:
    df = r["batch_sharing"]
    ok = (df["status"] == "ok").any()
    show(
        _statuses(df),
        df.pivot_table(index=["prefix_tokens", "n"], columns="sharing", values="median_ms").round(2) if ok else None,
        r["batch_sharing_breakeven"],
        r["batch_sharing_cost_fit"].round(3),
        plots.batch_sharing(
            df,
            r["batch_sharing_breakeven"],
            f"{r.model} on {r.dev.name}: n requests, common prefix + {r.P['suffix_tokens']} tokens each, time to "
            "the last first token",
        ),
    )


def show_policies(r: Run) -> None:
    sim = r["policy_hit_rates"]
    top = sim[sim["alpha"] == sim["alpha"].max()]
    show(
        top.pivot_table(index="capacity", columns="policy", values="hit_rate").round(3),
        plots.policy_hit_rates(
            sim,
            f"{r.P['sim_requests']:,} requests over {r.P['sim_prefixes']} prefixes per α "
            "(simulated; capacity in whole-prefix slots)",
        ),
    )


def show_serving(r: Run) -> None:
    summary = r.tables.get("serving_summary")
    if summary is None:
        show("`serve = 'skip'`: no server-level runs.")
        return
    failed = not (summary["status"] == "ok").all()
    show(
        f"Trace: {r.serve_source}.",
        summary[[c for c in SERVING_COLUMNS if c in summary]].round(3),
        "Some server runs did not complete." if failed else None,
        plots.serving(r["serving_requests"], summary, f"{r.model} on {r.dev.name} over HTTP: {r.serve_source}"),
    )


def show_finding_notes(r: Run) -> None:
    show(finding_notes(r.findings))


def rerun(r: Run) -> str:
    return rerun_recipe(SLUG, r.P)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("07_prefix_cache")
