"""The controlled-acceptance page (``book/speculative_controlled.md``): its numbers, tables and figure, computed.

Reads Study 3's controlled-acceptance sweep through Study 3's reporting path on the book's device
(``s03_speculative.report.report(study_runs("03_speculative"))``): ``.controlled`` (one row per pair, batch, γ and α,
median over repeats), ``.controlled_pays`` (the α above which each pair pays), the raw rows (``controlled_raw``) and
the run's ``run.json`` (its controlled part's); and the engine's benchmark (``<slug>/engine/bench.csv``). It writes
the page's includes: what was measured and what the time budget left out, the goal check of the 8B-shape pair, the
cost of a draft step as the loop ran beside the engine's own decode, the α above which each pair pays, the
curves (SVG, ``controlled_figure``) and how to measure the sweep again. Nothing on the page is typed; a study whose
report is not converted to the measure/report split (no ``report(runs)`` with ``.controlled``), a report that fails,
or a missing run is a sentence ("not measured"), never a crash.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.paths import REPO_ROOT
from servelab.speculative import leviathan
from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.s03_speculative import report
from servelab.studies.s03_speculative.measure import CONTROLLED_PARTS
from servelab.studies.s03_speculative.verdicts import SEED_TARGET_OVER_DRAFT
from servelab_book.controlled_figure import figure_svg
from servelab_book.engine_bench import bench_provenance, find_bench
from servelab_book.findings import BOOK_DEVICE

STUDY = "03_speculative"
FIGURE = "controlled_curves.svg"
ENGINE_METRIC = "decode_ms_b1_ctx128"  # the engine's batch-1 decode step at 128 tokens of context, ms
MODELS_DIR = REPO_ROOT / "data" / "models"  # the shipped configs the pairs were built from
INCLUDES = tuple(f"controlled_{part}.md" for part in ("setup", "goal", "cost", "pays", "figure", "rerun"))  # the page's


@dataclass
class ControlledRun:
    """Study 3's controlled-acceptance sweep as its report gives it: the table (median over repeats), where each
    pair pays, the raw rows (None if absent) and the controlled part's ``run.json``."""

    table: pd.DataFrame
    pays: pd.DataFrame
    raw: pd.DataFrame | None
    run: dict
    tested_on: str = ""  # the report's ``shapes_tested_on``
    parts: dict[str, tuple[dict, ...]] = field(default_factory=dict)  # controlled part -> each repeat's run.json
    total_repeats: int = 0  # the study's repeats (a pair's points may rest on fewer: ``pays.n_repeats``)

    @property
    def commits(self) -> list[str]:
        """The short commits the sweep's runs measured at, in order (one, where a single run or commit made it)."""
        metas = [m for ms in self.parts.values() for m in ms] or [self.run]
        return sorted({str(m.get("git_commit") or m.get("commit") or "unknown")[:7] for m in metas})

    def part_of(self, target: str, batch: int) -> str | None:
        """The part of the campaign that measures ``target`` at ``batch`` (None in a run of one part for all)."""
        for part, (name, batches) in CONTROLLED_PARTS.items():
            if name == target and (batches is None or batch in batches):
                return part
        return None

    @property
    def params(self) -> dict:
        return self.run.get("params") or {}


@dataclass(frozen=True)
class EngineDecode:
    """The engine benchmark's batch-1 decode step, and where it was measured."""

    ms: float
    model: str  # the benchmark's model spec, e.g. "config:qwen2-0.5b"
    commit: str


@dataclass
class PageFiles:
    """What ``prepare`` writes for the page: markdown includes by name, and the figure (None without a run)."""

    markdown: dict[str, str] = field(default_factory=dict)
    svg: str | None = None


def study3_report(root: Path | None = None, device: str = BOOK_DEVICE):
    """Study 3's page record over its runs on ``device``, or the reason there is none (str)."""
    from servelab_book.findings import study_page

    return study_page(STUDY, root, device)


def _controlled_parts(runs) -> list[str]:
    """The runs' controlled parts: "controlled" in the legacy layout, else the ``controlled_*`` parts measured."""
    return [p for p in runs.parts if p == "controlled"] + [p for p in runs.parts if p.startswith("controlled_")]


def _controlled_meta(runs) -> dict:
    """The ``run.json`` of the runs' first controlled part; the first run's where none is named so."""
    parts = _controlled_parts(runs)
    return dict(runs.part(parts[0]).meta) if parts else dict(runs.meta)


def find_controlled(root: Path | None = None, device: str = BOOK_DEVICE) -> ControlledRun | str:
    """The controlled-acceptance sweep on the book's device, from Study 3's report; where there is none, why (str)."""
    page = study3_report(root, device)
    if isinstance(page, str):
        return page
    table = getattr(page, "controlled", None)
    if not page.runs.measured or table is None or table.empty:
        return "the controlled-acceptance sweep has no run on the book's device"
    raw = page.runs.table("controlled_raw")
    return ControlledRun(
        table.reset_index(drop=True),
        getattr(page, "controlled_pays", pd.DataFrame()),
        raw if len(raw) else None,
        _controlled_meta(page.runs),
        str(getattr(page, "shapes_tested_on", "") or ""),
        {p: tuple(r.meta for r in page.runs.part(p).runs) for p in _controlled_parts(page.runs)},
        len(page.runs.repeats),
    )


def find_engine_decode(root: Path | None = None, device: str = BOOK_DEVICE) -> EngineDecode | None:
    """The engine's ``decode_ms_b1_ctx128`` row and its model and commit; None where the bench has not run."""
    bench = find_bench(root, device)
    if bench is None:
        return None
    df = pd.read_csv(bench)
    row = df[df.metric == ENGINE_METRIC]
    if row.empty:
        return None
    side = bench.parent / "run.json"
    model = json.loads(side.read_text()).get("params", {}).get("model", "") if side.exists() else ""
    prov = bench_provenance(bench)
    return EngineDecode(float(row.value.iloc[0]), str(model), prov.commit if prov else "")


# --- the numbers -------------------------------------------------------------------------------------------


def c_needed(alpha: float, speedup: float, gammas) -> tuple[int, float]:
    """The largest cost ratio c (draft step / target step) at which Leviathan's prediction reaches ``speedup`` at
    ``alpha`` for some γ in ``gammas``, and that γ: c = (E[tokens] / speedup − 1) / γ, negative where even free
    drafts fall short."""
    best = max(((float(leviathan.expected_tokens(alpha, g)) / speedup - 1) / g, int(g)) for g in gammas)
    return best[1], best[0]


def predicted_break_even(c: float, gammas) -> float:
    """The α above which Leviathan's prediction at cost ratio ``c`` is over 1 for the best γ in ``gammas``."""
    return min(leviathan.break_even_alpha(c, int(g)) for g in gammas)


def pair_label(draft: str, target: str) -> str:
    return f"{draft} → {target}"


def shape_of(model: str) -> str:
    """The architecture a shipped config stands for: ``qwen2-0.5b-vocab128k`` is ``qwen2-0.5b``'s shape with another
    vocabulary."""
    return model.removeprefix("config:").split("-vocab")[0]


def engine_timed(draft: str, engine: EngineDecode | None) -> bool:
    """The engine benchmark timed ``draft``'s shape (its model, or that model with another vocabulary)."""
    return engine is not None and shape_of(draft) == shape_of(engine.model)


def cost_table(table: pd.DataFrame, engine: EngineDecode | None) -> pd.DataFrame:
    """Per pair and batch: the plain target step (ms, from tokens_per_s_plain), c (median and range over every
    point), the draft step as the loop ran (c × target step, ms) and, at batch 1, the engine's own decode step where
    the benchmark timed the draft's shape (another shape's time says nothing of this draft's step)."""
    rows = []
    for (t, d, b), grp in table.groupby(["target", "draft", "batch"], sort=False):
        target_ms = 1e3 * b / float(grp.tokens_per_s_plain.median())  # tokens of the whole batch per step
        c = float(grp.c.median())
        engine_ms = engine.ms if b == 1 and engine_timed(d, engine) else math.nan
        rows.append(
            dict(
                target=t,
                draft=d,
                batch=int(b),
                target_ms=target_ms,
                c=c,
                c_low=float(grp.c.min()),
                c_high=float(grp.c.max()),
                draft_ms=c * target_ms,
                engine_ms=engine_ms,
                draft_over_engine=c * target_ms / engine_ms,
            )
        )
    return pd.DataFrame(rows)


def pays_table(table: pd.DataFrame, pays: pd.DataFrame, gammas) -> pd.DataFrame:
    """Where each pair pays (the report's ``controlled_pays``: measured, at the best γ) beside c, the target/draft
    step ratio 1/c and the α at which the prediction breaks even at that c (best of ``gammas``). c is the report's
    own (``tables.break_even_alpha``: the median over every point of the pair and batch, every γ and α, as the cost
    table's): Study 3's table of where each pair pays once took it over the best-γ rows alone, and the two pages read
    0.610 and 0.593 for the same runs under one name."""
    if "c" not in pays:  # a report from before the pays table carried c
        cost = cost_table(table, None)[["target", "draft", "batch", "c"]]
        pays = pays.merge(cost, on=["target", "draft", "batch"])
    return pays.assign(ratio=1 / pays.c, predicted_alpha=[predicted_break_even(c, gammas) for c in pays.c])


def not_yet(run: ControlledRun) -> list[str]:
    """The pairs and batches whose part of the campaign has no run at this fingerprint yet (``make gpu-plan``)."""
    out = []
    for d_spec, t_spec in run.params.get("controlled_pairs", []):
        d, tg = d_spec.removeprefix("config:"), t_spec.removeprefix("config:")
        by_part: dict[str, list[int]] = {}
        for b in run.params.get("batches", []):
            if _waits(run, tg, b):
                by_part.setdefault(str(run.part_of(tg, b)), []).append(b)
        out += [f"{pair_label(d, tg)} at batch {', '.join(map(str, bs))} (part {p})" for p, bs in by_part.items()]
    return out


def _waits(run: ControlledRun, target: str, batch: int) -> bool:
    part = run.part_of(target, batch)
    return bool(run.parts) and "controlled" not in run.parts and part is not None and part not in run.parts


def left_out(run: ControlledRun) -> list[str]:
    """What a run's time budget left out: pairs never loaded, batches with no point, batches with some points
    (pairs and batches whose part has not run yet are ``not_yet``'s, not the budget's)."""
    P, t = run.params, run.table
    per_batch = len(P.get("alphas", [])) * len(P.get("controlled_gammas", []))
    out = []
    for d_spec, t_spec in P.get("controlled_pairs", []):
        d, tg = d_spec.removeprefix("config:"), t_spec.removeprefix("config:")
        have = t[(t.target == tg) & (t.draft == d)]
        batches = [b for b in P.get("batches", []) if not _waits(run, tg, b)]
        if have.empty and batches:
            out.append(f"{pair_label(d, tg)}: not reached (no batch size)")
            continue
        for b in batches:
            n = int((have.batch == b).sum())
            if n == 0:
                out.append(f"{pair_label(d, tg)} at batch {b}: no point")
            elif n < per_batch:
                out.append(f"{pair_label(d, tg)} at batch {b}: {n} of {per_batch} points")
    return out


def vocab_size(name: str, models_dir: Path = MODELS_DIR) -> int | None:
    """The vocabulary of a shipped config (``data/models/<name>/config.json``), None if it is not shipped."""
    cfg = models_dir / name / "config.json"
    return json.loads(cfg.read_text()).get("vocab_size") if cfg.exists() else None


# --- the page's includes -----------------------------------------------------------------------------------


def _when(run: dict) -> str:
    when = str(run.get("written_utc") or run.get("started_utc") or "")
    return f"{when[:10]} {when[11:16]} UTC" if len(when) >= 16 else "at an unrecorded time"


def render_setup(run: ControlledRun, models_dir: Path = MODELS_DIR) -> str:
    """What was measured, on what, at which commit and device, and what the budget left out."""
    P, dev = run.params, run.run.get("device", {})
    pairs = []
    for d_spec, t_spec in P.get("controlled_pairs", []):
        d, t = d_spec.removeprefix("config:"), t_spec.removeprefix("config:")
        pairs.append(f"`{md_text(d)}` drafting for `{md_text(t)}`, {_vocab_note(d, t, models_dir)}")
    lines = [
        "Pairs (draft → target), random weights of the exact architectures (`config:`):",
        "",
        *[f"- {p};" for p in pairs],
        "",
        f"α ∈ {{{', '.join(f'{a:g}' for a in P.get('alphas', []))}}}, "
        f"γ ∈ {{{', '.join(str(g) for g in P.get('controlled_gammas', []))}}}, "
        f"batch ∈ {{{', '.join(str(b) for b in P.get('batches', []))}}}; prompts of "
        f"{P.get('controlled_prompt_len')} tokens, {P.get('controlled_new_tokens')} new tokens per sequence, "
        f"{P.get('dtype')}. Each run times every point {P.get('controlled_repeats')} times (speedup: their median, "
        f"spread: min–max){_over_repeats(run)}.",
        "",
        f"Run on one {md_text(dev.get('name', 'unknown device'))} (PyTorch {md_text(dev.get('torch', '?'))}, CUDA "
        f"{md_text(dev.get('cuda', '?'))}) at commit {', '.join(f'`{md_text(c)}`' for c in run.commits)}: "
        f"{len(run.table)} points, each run in a time budget of {P.get('controlled_budget_s')} s. "
        + _runs_sentence(run),
    ]
    if run.tested_on:
        lines += ["", f"Tested on: {md_text(run.tested_on)}."]
    gaps = left_out(run)
    if gaps:
        lines += ["", "The budget stopped the sweep before:", "", *[f"- {md_text(g)};" for g in gaps]]
    else:
        lines += ["", "The time budget stopped no pair or batch size before its last point."]
    waiting = not_yet(run)
    if waiting:
        lines += ["", "Not measured yet (their part has no run at this fingerprint; `make gpu-plan` lists it):", ""]
        lines += [f"- {md_text(w)};" for w in waiting]
    return "\n".join(lines) + "\n"


def pair_repeats(run: ControlledRun, draft: str, target: str, batch: int | None = None) -> str:
    """What the pair's points (at ``batch``) rest on, of the study's repeats (``report.point_repeats``)."""
    return report.point_repeats(run.pays, run.total_repeats, draft, target, batch) if run.total_repeats else ""


def _over_repeats(run: ControlledRun) -> str:
    """'; each point is then the median over the study's repeats that measured it (…: 3; …: 1)', or ''."""
    said = []
    for d, t in dict.fromkeys(zip(run.table.draft, run.table.target, strict=True)):
        n = report.repeat_count(run.pays, d, t) if len(run.pays) else None
        if n is not None:
            said.append(f"{pair_label(d, t)}: {report.count_text(n)}")
    if not said:
        return ""
    return f"; each point is then the median over the study's repeats that measured it ({'; '.join(said)})"


def _runs_sentence(run: ControlledRun) -> str:
    """Which parts ran, how many repeats each, and how long a run took with its loads."""
    if not run.parts:
        return f"The sweep took {run.run.get('wall_s', math.nan):.0f} s with the loads, finished {_when(run.run)}."
    said = []
    for part, metas in run.parts.items():
        secs = [float(m["duration_s"]) for m in metas if m.get("duration_s") is not None]
        span = f"{min(secs):.0f}" if len(secs) == 1 else f"{min(secs or [0]):.0f}–{max(secs or [0]):.0f}"
        took = f", {span} s a run with the loads" if secs else ""
        said.append(f"{part} ({len(metas)} repeat{'s' if len(metas) != 1 else ''}{took})")
    return f"Each part of the sweep ran in a fresh process per repeat: {'; '.join(said)}."


def _vocab_note(draft: str, target: str, models_dir: Path) -> str:
    """The pair's vocabularies; for a draft shipped as ``<shape>-vocab…``, the shape's own vocabulary too."""
    vd, vt = vocab_size(draft, models_dir), vocab_size(target, models_dir)
    if vd is None or vt is None:
        return "vocabularies not recorded"
    if vd != vt:
        return f"vocabularies {vd:,} (draft) and {vt:,} (target)"
    text = f"both with a vocabulary of {vt:,}"
    base = draft.split("-vocab")[0]
    own = vocab_size(base, models_dir) if base != draft else None
    if own is not None and own != vd:
        text += (
            f": the draft is `{md_text(base)}`'s shape with `{md_text(target)}`'s vocabulary in place of its own "
            f"{own:,}, so that draft and target share token ids (the real models' vocabularies differ)"
        )
    return text


def goal_verdict(goal: dict) -> str:
    """'met', or 'missed' with each part of the goal that failed and by how much."""
    if goal["met"]:
        return "met"
    why = []
    if goal["speedup"] < report.GOAL_SPEEDUP:
        short = report.GOAL_SPEEDUP - goal["speedup"]
        why.append(
            f"the speedup is {short:.2f}× short of {report.GOAL_SPEEDUP:g}× "
            f"({100 * goal['speedup'] / report.GOAL_SPEEDUP:.0f}% of it)"
        )
    if abs(goal["gap_pct"]) > report.GOAL_WITHIN_PCT:
        why.append(f"it is {abs(goal['gap_pct']):.1f}% from the prediction (allowed {report.GOAL_WITHIN_PCT:g}%)")
    return "missed: " + " and ".join(why)


def render_goal(table: pd.DataFrame, gammas, run: ControlledRun | None = None) -> str:
    """The goal check of the 8B-shape pair (``report.goal_check``), what its point rests on (``run``'s repeats) and
    what c the goal needs."""
    goal = report.goal_check(table)
    if goal is None:
        return f"The goal's point (the 8B-shape target at α = {report.GOAL_ALPHA:g}, batch 1) did not run.\n"
    g_need, c_need = c_needed(report.GOAL_ALPHA, report.GOAL_SPEEDUP, gammas)
    side = "below" if goal["gap_pct"] >= 0 else "above"
    within = "within" if abs(goal["gap_pct"]) <= report.GOAL_WITHIN_PCT else "outside"
    on = pair_repeats(run, goal["draft"], goal["target"], 1) if run is not None else ""
    text = (
        f"`{md_text(goal['draft'])}` → `{md_text(goal['target'])}` at α = {report.GOAL_ALPHA:g}, batch 1, best "
        f"γ = {goal['gamma']}: **{goal['speedup']:.2f}×** (its timed rounds {goal['speedup_low']:.2f}–"
        f"{goal['speedup_high']:.2f}×){f', {on},' if on else ''} against **{goal['predicted']:.2f}×** predicted by "
        "Leviathan's formula from "
        f"the c = {goal['c']:.3f} measured in the same loop: {abs(goal['gap_pct']):.1f}% {side} the prediction, "
        f"{within} the {report.GOAL_WITHIN_PCT:g}% allowed. The goal (≥ {report.GOAL_SPEEDUP:g}× within "
        f"{report.GOAL_WITHIN_PCT:g}% of the prediction) is **{goal_verdict(goal)}**.\n\n"
    )
    if goal["predicted"] < report.GOAL_SPEEDUP:
        text += (
            f"The prediction itself is below {report.GOAL_SPEEDUP:g}×: at α = {report.GOAL_ALPHA:g} the goal needs "
            f"c ≤ {c_need:.3f} (at γ = {g_need}, the best of the γ swept; solving "
            f"{report.GOAL_SPEEDUP:g} = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) for c), and the loop ran at "
            f"c = {goal['c']:.3f}, {goal['c'] / c_need:.2f}× that. What is missing is a cheaper draft step, not a "
            "better match to the formula.\n"
        )
    wider = report.batch_goal_sentence(report.batch_goals(table))
    return text + (f"\n{wider}\n" if wider else "")


def _span(values: pd.Series, fmt: str) -> str:
    """'a–b' over ``values``, or one number where they agree at this precision."""
    lo, hi = format(float(values.min()), fmt), format(float(values.max()), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def render_cost(table: pd.DataFrame, engine: EngineDecode | None, run: ControlledRun | None = None) -> str:
    """c and the draft step per pair and batch, beside the engine's own batch-1 decode of the draft's shape."""
    cost = cost_table(table, engine)
    rows = [
        [
            md_text(pair_label(r.draft, r.target)),
            str(r.batch),
            f"{r.target_ms:.2f}",
            f"{r.c:.3f} ({r.c_low:.3f}–{r.c_high:.3f})",
            f"{r.draft_ms:.2f}",
            "—" if math.isnan(r.engine_ms) else f"{r.engine_ms:.3f}",
            "—" if math.isnan(r.draft_over_engine) else f"{r.draft_over_engine:.1f}×",
        ]
        for r in cost.itertuples()
    ]
    header = [
        "draft → target",
        "batch",
        "target step (ms)",
        "c, median over every γ and α (range)",
        "draft step in the loop (ms)",
        "engine decode of the draft's shape, batch 1 (ms)",
        "loop / engine",
    ]
    text = list_table(header, rows, css="servelab-controlled-cost") + "\n"
    if engine is None:
        return text + "The engine's benchmark has not run on the H200, so there is no engine decode to compare.\n"
    b1 = cost[cost.batch == 1]
    commit = ", ".join(f"`{md_text(c)}`" for c in run.commits) if run is not None else "an unrecorded commit"
    shape = shape_of(engine.model)
    text += (
        f"The target step is one plain decode step of the whole batch (batch × 1000 / tokens_per_s_plain); the draft "
        f"step is c × that, its device time inside the loop. The engine column is the engine benchmark's "
        f"`{ENGINE_METRIC}` for `{md_text(shape)}`, measured at commit "
        f"`{md_text(engine.commit)}` (this sweep ran at {commit}), in the engine's default "
        "configuration (CUDA graphs), so it stands beside the drafts of that shape only. "
        + _loop_over_engine(b1, shape)
    )
    return text + _engine_c_sentence(table, b1, engine)


def _loop_over_engine(b1: pd.DataFrame, shape: str) -> str:
    """How much the loop's draft step costs over the engine's own decode of the same shape, at batch 1."""
    same = b1.dropna(subset=["draft_over_engine"])
    if same.empty:
        return f"No draft here has `{md_text(shape)}`'s shape, so the loop's draft steps have no engine time beside.\n"
    drafts = ", ".join(f"`{md_text(d)}`" for d in dict.fromkeys(same.draft))
    return (
        f"At batch 1 the draft step in the loop ({drafts}) took {_span(same.draft_over_engine, '.1f')}× the engine's "
        "own decode of that shape: that gap is what the loop costs around the draft's forward.\n"
    )


def _engine_c_sentence(table: pd.DataFrame, b1: pd.DataFrame, engine: EngineDecode) -> str:
    """What the 8B-shape pair's prediction would be at α = 0.8 (best of the γ swept) if its draft step cost the
    engine's decode."""
    gammas = sorted(int(g) for g in table.gamma.unique())
    goal = report.goal_check(table)
    row = b1[b1.target == goal["target"]] if goal is not None else b1.iloc[:0]
    if row.empty:
        return ""
    c_eng = engine.ms / float(row.target_ms.iloc[0])
    imp, g = max((float(leviathan.improvement(report.GOAL_ALPHA, g, c_eng)), int(g)) for g in gammas)
    vocab_note = ""
    v_draft, v_engine = vocab_size(goal["draft"]), vocab_size(engine.model.removeprefix("config:"))
    if v_draft is not None and v_engine is not None and v_draft < v_engine:
        vocab_note = (
            f" (the engine timed the shape with its own vocabulary of {v_engine:,} tokens, larger than the "
            f"{v_draft:,} of the pair's draft, so the engine's time is if anything an upper bound)"
        )
    return (
        f"\nWere the 8B-shape pair's draft step as cheap as the engine's decode{vocab_note}, c would be "
        f"{c_eng:.3f} and the prediction at α = {report.GOAL_ALPHA:g} {imp:.2f}× (γ = {g}).\n"
    )


def render_pays(table: pd.DataFrame, pays: pd.DataFrame, gammas) -> str:
    """The α above which each pair pays at each batch (measured, at its best γ: the report's ``controlled_pays``)
    beside the prediction's and the seed's cost ratio."""
    pays = pays_table(table, pays, gammas)
    rows = []
    for r in pays.itertuples():
        if np.isnan(r.alpha_pays):
            measured = f"never (best {r.best_speedup:.2f}× at α ≤ {r.alpha_max:g})"
        elif r.all_pay:
            measured = f"≤ {r.alpha_pays:g} (pays at every α measured; best {r.best_speedup:.2f}×)"
        else:
            measured = f"{r.alpha_pays:.2f} (best {r.best_speedup:.2f}×)"
        rows.append(
            [
                md_text(pair_label(r.draft, r.target)),
                str(r.batch),
                measured,
                f"{r.predicted_alpha:.2f}",
                f"{r.c:.3f}",
                f"{r.ratio:.2f}×",
            ]
        )
    header = [
        "draft → target",
        "batch",
        "pays above α (measured)",
        "predicted from c",
        "c (median over every γ and α)",
        "target / draft step",
    ]
    seed_alpha = predicted_break_even(1 / SEED_TARGET_OVER_DRAFT, gammas)
    return (
        list_table(header, rows, css="servelab-controlled-pays")
        + f"\nThe seed measured a target/draft step ratio of {SEED_TARGET_OVER_DRAFT}× for Qwen2-0.5B → 1.5B on its "
        f"RTX 2070 (c = {1 / SEED_TARGET_OVER_DRAFT:.3f}); at that c Leviathan's formula puts the break-even at "
        f"α = {seed_alpha:.2f}.\n"
    )


def render_figure_block(run: ControlledRun) -> str:
    """The figure directive with a caption that says what to see, computed from the run."""
    goal = report.goal_check(run.table)
    gammas = sorted(run.table.gamma.unique())
    t = run.table
    above = int((t.predicted_speedup > t.speedup).sum())
    by_batch = t.groupby("batch").prediction_error_pct.median()
    gaps = ", ".join(f"batch {b}: {v:+.0f}%" for b, v in by_batch.items())
    err = t.prediction_error_pct.abs()
    # F3.2's note gives the median |error| of these same points: both are said here, so that its "batch 1" number
    # and this signed one stand as two statistics of one point set, not two measurements
    caption = (
        f"Speedup over plain decoding against the α set, one panel per pair and batch size, one colour per γ "
        f"({', '.join(map(str, gammas))}): markers and solid lines are measured (median of the repeats, bars "
        f"min–max), dashed lines Leviathan's prediction from the c measured in the loop. The dotted line is "
        f"break-even. The prediction is above the measurement at {above} of {len(t)} points; the median of the "
        f"signed error, (predicted − measured) / measured, by batch is {gaps}. Without its sign (the |error| F3.2's "
        f"note quotes for these points) the median is {err.median():.0f}% over all {len(t)} and "
        f"{err[t.batch == 1].median():.0f}% at batch 1."
    )
    if goal is not None:
        caption += (
            f" The goal's point (α = {report.GOAL_ALPHA:g}, batch 1, the 8B-shape target) is the star: "
            f"{goal['speedup']:.2f}× against {report.GOAL_SPEEDUP:g}×."
        )
    return (
        f"```{{figure}} _generated/{FIGURE}\n:name: fig-controlled-curves\n"
        f":alt: measured and predicted speedup against α\n\n{caption}\n```\n"
    )


def render_rerun() -> str:
    """How to measure the sweep again: one campaign job per controlled part (a fresh process each), then render."""
    jobs = "\n".join(f"scripts/gpu_run.sh {STUDY}:{part}:0" for part in CONTROLLED_PARTS)
    return (
        f"On a CUDA machine, one job per part of Study 3 that runs this sweep, each in a fresh process (`:0` is the "
        f"first repeat; `make gpu-plan` lists the jobs missing at today's measuring code):\n\n```bash\n{jobs}\n```\n\n"
        f"Each writes its raw rows and run record under `data/results/<device>/{STUDY}/runs/<fingerprint>/<part>/"
        "r<repeat>/`; `python -m servelab_book prepare` then rebuilds this page from them. The time budget "
        "(`controlled_budget_s`, a parameter of Study 3's notebook) starts no new point once spent; *What was "
        "measured* above says whether it stopped any.\n"
    )


def controlled_page(root: Path | None = None, device: str = BOOK_DEVICE, models_dir: Path = MODELS_DIR) -> PageFiles:
    """Every include of the page, and its figure; sentences saying "not measured", and why, where the sweep has no
    run or Study 3's report cannot give it."""
    run = find_controlled(root, device)
    if isinstance(run, str):
        missing = f"Not measured: {run}. The controlled-acceptance sweep has not run on the H200 yet.\n"
        return PageFiles(dict.fromkeys(INCLUDES, md_text(missing) + "\n") | {"controlled_rerun.md": render_rerun()})
    gammas = run.params.get("controlled_gammas") or sorted(run.table.gamma.unique())
    engine = find_engine_decode(root, device)
    texts = (
        render_setup(run, models_dir),
        render_goal(run.table, gammas, run),
        render_cost(run.table, engine, run),
        render_pays(run.table, run.pays, gammas),
        render_figure_block(run),
        render_rerun(),
    )
    device_name = run.run.get("device", {}).get("name", device)
    return PageFiles(dict(zip(INCLUDES, texts, strict=True)), figure_svg(run.table, device_name))
