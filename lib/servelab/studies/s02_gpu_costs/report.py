"""Study 2's reporting path: everything its page shows, computed from the runs' files (``report``), and the page
text: takeaways and compact tables (about a dozen rows at most, units in the headings; the full tables are the runs'
CSVs). Each repeat's verdicts come from its own steps; tables and figures show each point's median over repeats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from servelab.sim.cost_fit import fit_all, heldout_table
from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.page import verdict_table as page_verdict_table
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats, study_runs
from servelab.studies.common.study_page import StudyPage
from servelab.studies.common.tested_on import model_name
from servelab.studies.s02_gpu_costs import eager_spread, verdicts
from servelab.studies.s02_gpu_costs.launch_overhead import launch_overhead

STUDY = "02_gpu_costs"
# what identifies one timed step: its median over repeats is the value the page's tables and figures show
STEP_KEYS = ["model", "mode", "phase", "batch", "new_tokens", "context", "decodes", "decode_context", "path"]


@dataclass
class Study2Page(StudyPage):
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # every step, median over repeats
    ceilings: object = None  # servelab.measure.Ceilings of the first run
    kernel_profile: pd.DataFrame = field(default_factory=pd.DataFrame)
    modes: pd.DataFrame = field(default_factory=pd.DataFrame)
    server_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    overhead: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost_fit: pd.DataFrame = field(default_factory=pd.DataFrame)
    heldout: pd.DataFrame = field(default_factory=pd.DataFrame)
    predicted: pd.DataFrame = field(default_factory=pd.DataFrame)
    bench_decode: pd.DataFrame = field(default_factory=pd.DataFrame)  # the engine benchmark's default decode steps


def modes_table(steps: pd.DataFrame) -> pd.DataFrame:
    """The same decode step (batch 1, the shortest context) in each mode, against its floor."""
    dec = steps[(steps.status == "ok") & (steps.phase == "decode")]
    first = dec[(dec.batch == 1) & (dec.context == dec.context.min())]
    cols = ["model", "mode", "context", "median_ms", "p25_ms", "p75_ms", "floor_ms", "pct_of_floor"]
    return first[cols].assign(times_floor=lambda t: t.median_ms / t.floor_ms)


def server_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The engine's chunks after context and mixed steps."""
    return steps[
        (steps.status == "ok")
        & steps["mode"].isin(["engine", "engine_eager"])
        & ((steps.phase == "mixed") | ((steps.phase == "prefill") & (steps.context > 0)))
    ]


def bench_decode(device_dir: Path | None) -> pd.DataFrame:
    """The engine benchmark's decode steps in its default configuration in ``device_dir`` (``<device>/engine/
    decode.csv``, the engine page's), with the model its ``run.json`` names; empty where it has not run there."""
    folder = None if device_dir is None else Path(device_dir) / "engine"
    if folder is None or not (folder / "decode.csv").is_file():
        return pd.DataFrame()
    try:
        model = json.loads((folder / "run.json").read_text())["params"]["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return pd.DataFrame()
    d = pd.read_csv(folder / "decode.csv")
    d = d[(d["impl"] == "engine_default") & (d["status"] == "ok")]
    return d.assign(model=model)[["model", "batch", "context", "median_ms", "note"]]


def compiled_sentence(steps: pd.DataFrame, bench: pd.DataFrame) -> str:
    """Study 2 times the engine as ``servelab.bench.step`` builds it, in CUDA graphs but without torch.compile; the
    engine's default, which the servers of Studies 1 and 7 run, compiles its blocks. The same decode steps from the
    engine benchmark, where it ran on this device, say how far apart the two are; empty where no step matches."""
    if bench.empty or "status" not in steps:
        return ""
    ours = steps[(steps.status == "ok") & (steps["mode"] == "engine") & (steps.phase == "decode")]
    both = ours.merge(bench, on=["model", "batch", "context"], suffixes=("", "_bench"))
    if both.empty:
        return ""
    pairs = "; ".join(
        f"batch {r.batch}, context {r.context:,}: {r.median_ms:.2f} ms here, {r.median_ms_bench:.2f} ms there"
        for r in both.sort_values(["batch", "context"]).itertuples()
    )
    return (
        "This study's `engine` mode is the engine's step in CUDA graphs without `torch.compile` "
        "(`servelab.bench.step.step_engine_config`); the engine's default configuration, which Studies 1 and 7 serve "
        f"with, also compiles its blocks. The engine page's benchmark times the same decode steps of "
        f"{model_name(both.model.iloc[0])} in that default: {pairs}. The simulator's GPU cost models taken from this "
        "study are fitted to these uncompiled steps."
    )


def repeat_findings(rep: RunSet) -> list[Finding]:
    """F2.1–F2.3 by today's rules from one repeat's steps (none where that repeat has no ``steps.csv``)."""
    steps = rep.table("steps")
    return verdicts.findings(steps, rep.params.get("dtype")) if "status" in steps else []


def fits(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The simulator's cost model fitted to ``steps`` (``fit_all``): its summary and every row's predictions; empty
    frames where too few steps ran to fit one (a smoke run, a missing part)."""
    try:
        _, predicted, summary = fit_all(steps)
    except ValueError:
        return pd.DataFrame(), pd.DataFrame()
    return summary, predicted


def report(runs: RunSet) -> Study2Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    findings = runs.combined(repeat_findings)
    steps = pool_repeats(runs.table("steps"), STEP_KEYS) if runs.measured else pd.DataFrame()
    if "status" not in steps:
        why = "no step of this study was timed in its runs" if runs.measured else "no run of this study on this device"
        return Study2Page(runs, findings or not_measured(STUDY, why))
    fit_summary, predicted = fits(steps)
    kp = runs.table("kernel_profile")
    return Study2Page(
        runs,
        with_pooled_decode(findings, runs, steps),
        steps,
        runs.ceiling_record,
        pool_repeats(kp, ["model", "mode"]) if not kp.empty else kp,
        modes_table(steps),
        server_steps(steps),
        launch_overhead(steps),
        fit_summary,
        heldout_table(predicted) if not predicted.empty else pd.DataFrame(),
        predicted,
        bench_decode(runs.device_folder),
    )


def with_pooled_decode(findings: list[Finding], runs: RunSet, steps: pd.DataFrame) -> list[Finding]:
    """F2.2's value and note read from each step's median over the repeats (``steps``), the statistic of the tables
    and figures beside them, in place of the one repeat's text the combined finding quotes: HF eager's decode time
    moves far more between repeats than the rule's number does (one repeat's qwen2-0.5b ran 16.8 ms/token, another
    31.5), so one repeat's range read against the modes table beside it contradicted it. The verdict, the headline and
    its interval over repeats stay the repeats' own."""
    pooled = verdicts.read_decode(steps)
    if pooled is None:
        return findings
    value, note = verdicts.decode_words(pooled)
    each = [verdicts.read_decode(rep.table("steps")) for rep in runs.per_repeat() if "status" in rep.table("steps")]
    bodies = [verdicts.decode_words(x)[1] for x in each if x is not None]
    out = []
    for f in findings:
        quoted = next((b for b in bodies if b in f.note), None) if f.id == "F2.2" and f.repeats > 1 else None
        if quoted is not None:  # the repeat's label before its text goes with it; the interval after it stays
            over = f" ({MEDIAN_OF_STEPS.format(n=f.repeats)})"
            spread = eager_spread.spread_sentence(runs.table("steps"))
            said = f"{note}{over}" + (f". {spread}" if spread else "")
            f = replace(f, measured_value=value + over, note=said + f.note.split(quoted, 1)[1])
        out.append(f)
    return out


OWN_DATA_F23 = " [this study's cost data alone: the book's verdict on F2.3 is decided on the simulator's page]"
OWN_READING = "this study's own reading"  # beside F2.3's verdict on this page: the book's verdict is elsewhere


def own_data_f23(findings: list[Finding]) -> list[Finding]:
    """The page's verdict table with F2.3's value cell saying whose verdict it is: this page judges its own cost data,
    and the book's F2.3 is the simulator's validation (``f23_elsewhere``), so a reader who reaches the cell from the
    findings table sees why the two differ. For the page only: the findings page quotes the study's own value."""
    return [
        replace(f, measured_value=f.measured_value + OWN_DATA_F23) if f.id == "F2.3" and f.repeats else f
        for f in findings
    ]


def verdict_table(findings: list[Finding], device: str) -> str:
    """The page's verdict table (``own_data_f23``), with F2.3's bold verdict labelled as this study's own reading: the
    book's verdict on F2.3 is the simulator's (``f23_elsewhere``), and a bare bold "changes" beside it read as the
    book's."""
    rows = page_verdict_table(own_data_f23(findings), device).split("\n")
    f = next((f for f in findings if f.id == "F2.3" and f.repeats), None)
    for i, row in enumerate(rows):
        if f is not None and row.startswith("| **F2.3** "):
            rows[i] = row.replace(f"| **{f.verdict}**", f"| **{f.verdict}** ({OWN_READING})", 1)
    return "\n".join(rows)


def _finding_sentence(f: Finding) -> str:
    """A claim's takeaway; F2.3's says that its verdict is this study's own reading, not the book's."""
    said = finding_sentence(f)
    if f.id == "F2.3" and f.repeats:
        said = said.replace(f"**{f.id} {f.verdict}.**", f"**{f.id} {f.verdict} ({OWN_READING}).**", 1)
    return said


MEDIAN_OF_STEPS = "each step's median over the {n} repeats, as the study's tables show it"


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """This study's number beside the published ones: none of its own (F2.3's held-out serving error is the
    simulator's, on the simulator page)."""
    return None


def launch_sentence(overhead: pd.DataFrame) -> str:
    """What CUDA graphs save the engine, over every step run both ways; empty if none was."""
    if overhead.empty:
        return ""
    small = overhead.nsmallest(1, "tokens").iloc[0]
    return (
        f"Across the {len(overhead)} steps run both ways, the engine without CUDA graphs takes "
        f"{overhead.eager_over_graph.min():.1f}–{overhead.eager_over_graph.max():.1f}× the time of the same step "
        f"replayed from a graph (median {overhead.eager_over_graph.median():.1f}×); the smallest step "
        f"({model_name(small.model)}, {small.step}) takes {small.eager_ms:.2f} ms launched kernel by kernel against "
        f"{small.graph_ms:.2f} ms from its graph, over a floor of {small.floor_ms:.3f} ms."
    )


def step_model_sentence(cost_fit: pd.DataFrame) -> str:
    """The engine's step cost model on held-out rows, per model; empty if it was not fitted."""
    fits = cost_fit[cost_fit["mode"] == "engine"] if "mode" in cost_fit else cost_fit.iloc[:0]
    if fits.empty or "step_heldout_median_abs_pct" not in fits:
        return ""
    parts = [
        f"{model_name(r.model)}'s with a median |error| of {r.step_heldout_median_abs_pct:.1f}% (max "
        f"{r.step_heldout_max_abs_pct:.0f}%, over {r.step_rows:.0f} steps)"
        for r in fits.itertuples()
    ]
    return "The engine's step cost model, fitted for the simulator, predicts held-out steps: " + "; ".join(parts) + "."


def takeaways(r: Study2Page) -> str:
    """One sentence per claim, then what graphs save the engine and how well its step cost model predicts."""
    return takeaway_list(
        [_finding_sentence(f) for f in r.findings]
        + [_spread_takeaway(r.runs)]
        + [f23_elsewhere(r.runs.results_root) if any(f.id == "F2.3" for f in r.findings) else ""]
        + [launch_sentence(r.overhead), compiled_sentence(r.steps, r.bench_decode), step_model_sentence(r.cost_fit)]
    )


def _spread_takeaway(runs: RunSet) -> str:
    """F2.2's HF-eager times beside their noise between repeats (``eager_spread``), or "" with one repeat."""
    said = eager_spread.spread_sentence(runs.table("steps")) if runs.measured else ""
    return f"{said}." if said else ""


SIMULATOR = "08_simulator"
FRESH_PART = "fresh"  # the simulator's held-out parts: fresh_<model>, drawn after its cost model was frozen


def f23_elsewhere(root: Path | None) -> str:
    """F2.3 asks whether the simulator's costs hold for a real server: this page can judge only its own cost data, and
    the book's verdict is the simulator's validation (the findings table takes that one). It is judged on Study 1's
    runs held out from the fit; whether a fresh held-out run stands beside it is read from the simulator's runs under
    ``root``, since that run is measured apart and may not exist yet."""
    sim = study_runs(SIMULATOR, root)
    fresh = sim.measured and any(p.startswith(FRESH_PART) for p in sim.parts)
    beside = (
        "with its error on a fresh held-out run of the real server beside it"
        if fresh
        else "not yet on a fresh held-out run"
    )
    return (
        "F2.3 above judges this study's cost data alone; the book's verdict on F2.3 is the simulator's validation "
        f"against Study 1's server runs held out from its fit, {beside}, on "
        "[the simulator's page](../simulator.ipynb), which the findings table shows."
    )


def _short(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(model=df["model"].map(model_name)) if "model" in df else df


def prefill_view(steps: pd.DataFrame) -> pd.DataFrame:
    """Per model and mode, at batch 1: prefill µs/token at the shortest and longest prompt, and % of the floor there."""
    d = steps[(steps.status == "ok") & (steps.phase == "prefill") & (steps.context == 0) & (steps.batch == 1)]
    if d.empty:
        return pd.DataFrame()
    rows = []
    for (model, mode), g in d.groupby(["model", "mode"], sort=False):
        lo, hi = g.loc[g.new_tokens.idxmin()], g.loc[g.new_tokens.idxmax()]
        rows.append(
            {
                "model": model_name(model),
                "mode": mode,
                "shortest prompt (tokens)": f"{int(lo.new_tokens):,}",
                "µs/token there": f"{lo.us_per_token:,.2f}",
                "longest prompt (tokens)": f"{int(hi.new_tokens):,}",
                "µs/token at the longest": f"{hi.us_per_token:,.2f}",
                "% of floor at the longest": round(hi.pct_of_floor, 2),
            }
        )
    return pd.DataFrame(rows)


def modes_view(modes: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "median_ms": "median (ms)",
        "p25_ms": "p25 (ms)",
        "p75_ms": "p75 (ms)",
        "floor_ms": "floor (ms)",
        "pct_of_floor": "% of floor",
        "times_floor": "× floor",
    }
    digits = {"median (ms)": 2, "p25 (ms)": 2, "p75 (ms)": 2, "floor (ms)": 3, "% of floor": 1, "× floor": 1}
    return _short(modes).rename(columns=cols).round(digits).reset_index(drop=True)


def server_steps_view(server: pd.DataFrame) -> pd.DataFrame:
    """Per model, mode and kind of step: how many were timed and their % of the floor (median, range)."""
    if server.empty:
        return pd.DataFrame()
    s = server.assign(kind=server["phase"].map({"mixed": "mixed step", "prefill": "chunk after context"}))
    g = s.groupby(["model", "mode", "kind"], sort=False)["pct_of_floor"]
    out = g.agg(steps="size", median="median", lowest="min", highest="max").reset_index()
    return (
        _short(out)
        .rename(columns={"median": "% of floor (median)", "lowest": "% of floor (min)", "highest": "% of floor (max)"})
        .round(1)
    )


KERNEL_COLUMNS = {  # header (unit), decimals shown
    "wall_ms": ("wall time (ms)", 2),
    "kernels": ("kernels launched", 0),
    "gpu_busy_ms": ("GPU busy (ms)", 2),
    "gpu_busy_pct": ("GPU busy (% of wall time)", 1),
    "cpu_us_per_launch": ("wall time per launch (µs)", 1),
    "n_repeats": ("repeats", 0),
}


def kernel_view(kernel_profile: pd.DataFrame) -> pd.DataFrame:
    """The profiled decode step per model and mode, with units in the headings (each value the median over the
    study's repeats)."""
    k = _short(kernel_profile)
    k = k.round({c: d for c, (_, d) in KERNEL_COLUMNS.items() if c in k.columns})
    whole = [c for c, (_, d) in KERNEL_COLUMNS.items() if d == 0 and c in k.columns and k[c].notna().all()]
    k[whole] = k[whole].astype(int)
    return k.rename(columns={c: name for c, (name, _) in KERNEL_COLUMNS.items()})


def fit_view(cost_fit: pd.DataFrame) -> pd.DataFrame:
    """Per model and mode: the fitted rows and the fits' errors (the coefficients are cost_fit's other columns)."""
    keep = [c for c in cost_fit.columns if c in ("model", "mode") or "pct" in c or c.endswith("rows")]
    out = _short(cost_fit[keep]).round(1)
    errors = [c for c in out.columns if c.endswith("_pct")]
    out[errors] = out[errors].astype(object).where(out[errors].notna(), "—")  # no such step in that mode
    return out.rename(columns=fit_label)


def fit_label(column: str) -> str:
    """cost_fit's column as a header: "step_heldout_mixed_median_abs_pct" -> "step model held-out, mixed: median
    |error| %", "prefill_median_abs_pct" -> "prefill fit: median |error| %"."""
    if column.endswith("_rows"):
        return f"{column.removesuffix('_rows').replace('step', 'step model')} rows"
    if not column.endswith("_abs_pct"):
        return column
    words = column.removesuffix("_abs_pct").split("_")
    subject, stat, middle = words[0], words[-1], words[1:-1]
    kind = "held-out" if "heldout" in middle else "fit"
    phase = [w for w in middle if w not in ("heldout", "fit")]
    name = "step model" if subject == "step" else subject
    return f"{name} {kind}{', ' + phase[0] if phase else ''}: {stat} |error| %"


def heldout_view(heldout: pd.DataFrame) -> pd.DataFrame:
    """Per model and mode, one row: the step model's held-out median |error| (%) in each phase (max in brackets)."""
    if heldout.empty:
        return heldout
    h = _short(heldout).assign(
        cell=lambda d: (
            d.heldout_median_abs_pct.round(1).astype(str)
            + " ("
            + d.heldout_max_abs_pct.round(0).astype(int).astype(str)
            + ")"
        )
    )
    out = h.pivot_table(index=["model", "mode"], columns="phase", values="cell", aggfunc="first", sort=False)
    out.columns = [f"{c}: median |error| % (max)" for c in out.columns]
    return out.reset_index()


def published(r: Study2Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, published_value(r.runs), r.device)
