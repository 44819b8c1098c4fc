"""Study 3's reporting path: everything its page shows, computed from the runs' raw files (``report``), and the page
text: takeaways, compact tables, the goal check of the 8B-shape pair. Each repeat's verdicts come from its own raw
rows (``repeat_findings``: its parts together); tables and figures show each point's median over repeats.

Raw tables by part (``measure.py``): ``generations``, ``step_costs``, ``models``, ``distill``, ``real_alpha``,
``verify_cost``, ``rollback_cost`` (real); ``shape_steps`` (costs); ``controlled_raw`` (controlled_*); ``lookup_raw``
(lookup). The legacy run (``runs/legacy/{all,controlled}/r0``) has ``step_costs`` with the seed's shapes in it and
``family`` (the substitute family it trained) instead of ``models``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.study_page import StudyPage
from servelab.studies.common.tested_on import tested_on as models_tested_on
from servelab.studies.s03_speculative import tables, verdicts
from servelab.studies.s03_speculative.measured_alpha import study6_alpha

STUDY = "03_speculative"
# the parts each claim's rule reads: F3.1 and F3.2 the trained pairs' speculative runs, F3.3 the seed shapes' step costs
NEEDS = {"F3.1": ("real",), "F3.2": ("real",), "F3.3": ("costs",)}
SEED_PAIR = ("qwen2-0.5b", "qwen2-1.5b")  # the seed's (draft, target), at its shapes
GOAL_SPEEDUP = 2.0  # issue 21: at α = 0.8, batch 1, best γ, the 8B-shape target with the 0.5B-shape draft
GOAL_WITHIN_PCT = 15.0  # … within this of Leviathan's prediction
GOAL_ALPHA = 0.8
GOAL_BATCH_SPEEDUPS = {8: 1.3}  # issue 30: batch 8 at α = 0.8, best γ, on the same pair (no prediction part)

SPEED_KEYS = ["target", "draft", "gamma", "temperature"]
RATIO_KEYS = ["draft", "target", "mode"]
CONTROLLED_KEYS = ["target", "draft", "batch", "gamma", "alpha"]
LOOKUP_KEYS = ["target", "batch", "gamma"]
PAYS_KEYS = ["target", "draft", "batch"]


@dataclass
class Study3Page(StudyPage):
    speedup: pd.DataFrame = field(default_factory=pd.DataFrame)  # the generation sweep's points, median over repeats
    cost_ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    verify_cost: pd.DataFrame = field(default_factory=pd.DataFrame)
    rollback_cost: pd.DataFrame = field(default_factory=pd.DataFrame)
    controlled: pd.DataFrame = field(default_factory=pd.DataFrame)
    controlled_pays: pd.DataFrame = field(default_factory=pd.DataFrame)
    lookup: pd.DataFrame = field(default_factory=pd.DataFrame)
    real_alpha: pd.DataFrame = field(default_factory=pd.DataFrame)  # this study's α of SmolLM2's proposers
    study6_alpha: pd.DataFrame | None = None  # Study 6's α of real drafts (None: not measured)
    distill: pd.DataFrame = field(default_factory=pd.DataFrame)
    pays_grid: pd.DataFrame = field(default_factory=pd.DataFrame)
    pays_points: pd.DataFrame = field(default_factory=pd.DataFrame)
    shape_ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    eager_outliers: str = ""  # repeats whose eager ratio is not physically plausible (``verdicts.implausible_eager``)
    quoted_repeat: str = ""  # F3.1's quoted repeat beside the pooled speedup table (``quoted_repeat_sentence``)
    real_tested_on: str = ""
    shapes_tested_on: str = ""


# ---- one repeat's derived tables (its parts together) ----


def param(rep: RunSet, key: str, default=None):
    """A parameter of the repeat: the first of its parts' runs that recorded it (the legacy parts differ)."""
    for r in rep.runs:
        p = r.meta.get("params") or {}
        if key in p:
            return p[key]
    return default


def _name(spec: str) -> str:
    return str(spec).removeprefix("config:")


def _first_pair(rep: RunSet, key: str) -> tuple[str, str]:
    """The first (draft, target) of the repeat's ``key`` pairs; the seed's own where the run recorded none."""
    pairs = param(rep, key) or [["config:" + SEED_PAIR[0], "config:" + SEED_PAIR[1]]]
    return _name(pairs[0][0]), _name(pairs[0][1])


def shape_pair(rep: RunSet) -> tuple[str, str]:
    return _first_pair(rep, "shape_pairs")


def _steps(rep: RunSet) -> pd.DataFrame:
    frames = [t for t in (rep.table("step_costs"), rep.table("shape_steps")) if not t.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def speculative_rows(gen: pd.DataFrame) -> pd.DataFrame:
    if gen.empty or "method" not in gen:
        return pd.DataFrame(columns=["draft", "target", "ms", "rollback_ms"])
    return gen[(gen.status == "ok") & (gen.method == "speculative")]


def cost_ratio_table(rep: RunSet) -> pd.DataFrame:
    """c per (draft, target, mode): the generation sweep's pairs and the seed's shapes."""
    spec = speculative_rows(rep.table("generations"))
    pairs = list(dict.fromkeys(zip(spec.draft, spec.target, strict=True))) + [shape_pair(rep)]
    return tables.cost_ratios(_steps(rep), pairs)


def speedup_of(rep: RunSet, ratios: pd.DataFrame) -> pd.DataFrame:
    gen = rep.table("generations")
    if gen.empty:
        return pd.DataFrame(columns=tables.SPEEDUP_COLUMNS)
    eng = ratios[ratios["mode"] == "engine"].set_index(["draft", "target"]).c.to_dict() if len(ratios) else {}
    return tables.speedup_table(gen, eng)


def controlled_of(rep: RunSet) -> pd.DataFrame:
    raw = rep.table("controlled_raw")
    return tables.controlled_table(raw.drop(columns=["part"], errors="ignore"))


def real_tested_on(rep: RunSet) -> str:
    """F3.1/F3.2's models: SmolLM2 and its distilled drafts (``models``), or the legacy run's trained family."""
    models, fam = rep.table("models"), rep.table("family")
    if not models.empty:
        t = models[models.role == "target"]
        d = models[models.role != "target"]
        drafts = ", ".join(f"{r.model} ({r.params / 1e6:.0f}M)" for r in d.itertuples())
        tgt = ", ".join(f"{r.model} ({r.params / 1e6:.0f}M, trained weights)" for r in t.itertuples())
        how = "distilled from it in this run" if (d.role == "distilled").any() else "as given"
        return f"target {tgt}; drafts {how}: {drafts}; {param(rep, 'dtype', '')}; held-out chat prompts"
    if not fam.empty:
        size = {r.model: r.params / 1e6 for r in fam.itertuples()}
        t = fam[fam.role == "target"].model.iloc[0]
        drafts = ", ".join(f"{m} ({size[m]:.0f}M)" for m in fam[fam.role != "target"].model)
        return (
            f"the substitute family trained in the run on Python source (trained weights): target {t} "
            f"({size[t]:.0f}M), drafts {drafts}; not Qwen2, not SmolLM2"
        )
    return "no trained pair measured"


def shapes_tested_on(rep: RunSet) -> str:
    """F3.3's models: the seed's shapes whose cost ratio was measured, and the controlled pairs that ran."""
    d, t = shape_pair(rep)
    raw = rep.table("controlled_raw")
    ok = raw[raw.status == "ok"] if "status" in raw else raw.iloc[:0]
    pairs = list(dict.fromkeys(zip(ok.draft, ok.target, strict=True))) if len(ok) else []
    batches = sorted({int(b) for b in ok.batch.dropna()}) if len(ok) else []
    specs = [f"config:{d}", f"config:{t}"] + [f"config:{x}" for p in pairs for x in p]
    setting = f"cost ratio of {d} → {t}"
    if pairs:
        setting += (
            f"; controlled acceptance on {', '.join(f'{a} → {b}' for a, b in pairs)} at batches "
            f"{', '.join(map(str, batches))}"
        )
    return models_tested_on(list(dict.fromkeys(specs)), dtype=param(rep, "dtype"), setting=setting)


@dataclass
class Derived:
    """One repeat's derived tables, computed once per render (the findings and the pooled tables both read them)."""

    ratios: pd.DataFrame
    speed: pd.DataFrame
    controlled: pd.DataFrame
    pays: pd.DataFrame

    @classmethod
    def of(cls, rep: RunSet) -> Derived:
        ratios = cost_ratio_table(rep)
        controlled = controlled_of(rep)
        return cls(ratios, speedup_of(rep, ratios), controlled, tables.break_even_alpha(controlled))


def repeat_findings(rep: RunSet, derived: Derived | None = None) -> list[Finding]:
    """F3.1–F3.3 by today's rules from one repeat's raw rows (its parts together); ``derived``: its tables where
    already computed (``Derived.of(rep)``)."""
    d = derived or Derived.of(rep)
    spec = speculative_rows(rep.table("generations"))
    kv_share = 100 * spec.rollback_ms.sum() / spec.ms.sum() if len(spec) else float("nan")
    real, shapes = real_tested_on(rep), shapes_tested_on(rep)
    label = real.split(";")[0]
    return [
        verdicts.f31(d.speed, kv_share, label, rep.device_name, tested_on=real),
        # the controlled curves' |error| is added to F3.2's note from the pooled curves (``with_controlled_error``)
        verdicts.f32(d.speed, tested_on=real),
        verdicts.f33(d.ratios, shape_pair(rep), tested_on=shapes),
    ]


# ---- the page ----


def _pooled(runs: RunSet, make, keys) -> pd.DataFrame:
    """``make(one repeat)`` for every repeat, each point's median over repeats."""
    frames = []
    for rep in runs.per_repeat():
        df = make(rep)
        if df is not None and len(df):
            frames.append(df.assign(repeat=rep.repeats[0]))
    if not frames:
        return pd.DataFrame()
    return pool_repeats(pd.concat(frames, ignore_index=True), keys).drop(columns="n_repeats")


def _repeats_measuring(runs: RunSet, make, keys: list[str]) -> pd.DataFrame:
    """``keys`` and ``n_repeats``: how many repeats' ``make(one repeat)`` have a row there (the pooled tables'
    medians over a point that one repeat measured are that one repeat's numbers)."""
    frames = [df[keys].assign(repeat=rep.repeats[0]) for rep in runs.per_repeat() if len(df := make(rep))]
    if not frames:
        return pd.DataFrame(columns=[*keys, "n_repeats"])
    return pd.concat(frames).groupby(keys).repeat.nunique().rename("n_repeats").reset_index()


def _each_repeat(runs: RunSet, make, col: str, cols: list[str]) -> pd.DataFrame | None:
    """Every repeat's ``make(repeat)`` rows that have ``col``, their ``RATIO_KEYS`` and ``cols`` with the repeat's
    data id (``repeat``); None where no repeat has any."""
    frames = []
    for rep in runs.per_repeat():
        df = make(rep)
        if df is not None and len(df) and col in df:
            frames.append(df[[*RATIO_KEYS, *cols]].assign(repeat=rep.repeats[0]))
    return pd.concat(frames, ignore_index=True) if frames else None


def _with_each_repeat(runs: RunSet, pooled: pd.DataFrame, make, col: str = "target_over_draft") -> pd.DataFrame:
    """``pooled`` with ``col`` of every repeat beside its median (``<col>_each``, "0.67 / 1.22 / 1.37"): each column's
    median is taken on its own, so the median ratio need not be the ratio of the median times, and where repeats
    disagree that much the reader sees it."""
    if pooled.empty or col not in pooled:
        return pooled
    each = _each_repeat(runs, make, col, [col])
    if each is None:
        return pooled
    joined = (
        each.sort_values("repeat")
        .groupby(RATIO_KEYS, sort=False)[col]
        .agg(lambda v: " / ".join(f"{x:.2f}" for x in v))
        .rename(f"{col}_each")
        .reset_index()
    )
    return pooled.merge(joined, on=RATIO_KEYS, how="left")


def _at_median_repeat(
    runs: RunSet, pooled: pd.DataFrame, make, col: str = "target_over_draft", times=("draft_ms", "target_ms")
) -> pd.DataFrame:
    """``pooled`` with the ``times`` of the repeat whose ``col`` is nearest its median over repeats
    (``<time>_at_median``) and that repeat's name (``median_repeat``). Each time's own median came from whichever
    repeat had it, so the medians side by side implied a ratio the median ratio contradicted (24.5 and 22.0 ms beside
    1.22×); one repeat's times give its ratio."""
    if pooled.empty or col not in pooled:
        return pooled
    each = _each_repeat(runs, make, col, [col, *times])
    if each is None:
        return pooled
    each["median_repeat"] = each["repeat"].map(runs.repeat_name)
    each = each.merge(pooled[[*RATIO_KEYS, col]].rename(columns={col: "_median"}), on=RATIO_KEYS)
    each["_gap"] = (each[col] - each["_median"]).abs()
    nearest = each.sort_values("_gap", kind="stable").drop_duplicates(RATIO_KEYS)
    keep = nearest[[*RATIO_KEYS, *times, "median_repeat"]].rename(columns={t: f"{t}_at_median" for t in times})
    return pooled.merge(keep, on=RATIO_KEYS, how="left")


def pays_grid(speed: pd.DataFrame, ratios: pd.DataFrame, pair: tuple[str, str]):
    """The map of the best predicted speedup over α × c (coarse: a figure, not a table), the measured pairs'
    points, and the seed's shapes' c per mode."""
    shape = ratios[(ratios.draft == pair[0]) & (ratios.target == pair[1])] if len(ratios) else ratios
    greedy = speed[speed.temperature == speed.temperature.min()] if len(speed) else speed
    pts = (
        greedy.groupby(["draft", "target"]).agg(alpha=("alpha", "median"), c=("c", "first")).reset_index()
        if len(greedy)
        else pd.DataFrame(columns=["draft", "target", "alpha", "c"])
    )
    cs = [1.2] + ([1.1 * pts.c.max()] if len(pts) else []) + ([1.1 * shape.c.max()] if len(shape) else [])
    grid = tables.pays_map(np.linspace(0.0, 1.0, 26), np.linspace(0.02, float(np.nanmax(cs)), 30))
    return grid, pts, shape


def report(runs: RunSet) -> Study3Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    s6 = study6_alpha(runs.results_root)
    if not runs.measured:
        return Study3Page(runs, not_measured(STUDY), study6_alpha=s6)
    derived = {rep.repeats[0]: Derived.of(rep) for rep in runs.per_repeat()}

    def of(rep: RunSet) -> Derived:
        return derived[rep.repeats[0]]

    findings = runs.combined(lambda rep: repeat_findings(rep, of(rep)), needs=NEEDS)
    ratios = _with_each_repeat(runs, _pooled(runs, lambda r: of(r).ratios, RATIO_KEYS), lambda r: of(r).ratios)
    ratios = _at_median_repeat(runs, ratios, lambda r: of(r).ratios)
    speed = _pooled(runs, lambda r: of(r).speed, SPEED_KEYS)
    controlled = _pooled(runs, lambda r: of(r).controlled, CONTROLLED_KEYS)
    # where each pair pays, from the pooled curve (each point's median over repeats): pooling each repeat's threshold
    # on its own gave 'pays above 0.88' beside a best speedup of 0.99x, where one repeat of three paid
    pays = tables.break_even_alpha(controlled) if len(controlled) else pd.DataFrame()
    if len(pays):
        pays = pays.merge(_repeats_measuring(runs, lambda r: of(r).controlled, PAYS_KEYS), on=PAYS_KEYS, how="left")
    findings = verdicts.with_seed_shapes(findings, seed_shapes_sentence(pays))
    findings = verdicts.with_controlled_error(findings, controlled)
    findings = verdicts.with_near_reading(findings)
    per_repeat = [(runs.repeat_name(rep.repeats[0]), of(rep).ratios) for rep in runs.per_repeat()]
    pair = shape_pair(runs.repeat(runs.repeats[0]))
    findings = with_f33_context(findings, per_repeat, ratios, controlled, pair)
    quoted = quoted_repeat_sentence(findings, runs, lambda r: of(r).speed, speed)
    lookup = _pooled(runs, lambda r: tables.lookup_table(r.table("lookup_raw")), LOOKUP_KEYS)
    real_alpha = _pooled(runs, lambda r: r.table("real_alpha").drop(columns=["part"], errors="ignore"), ["pair"])
    verify = _pooled(runs, lambda r: r.table("verify_cost"), ["model", "context", "rows"])
    rollback = _pooled(runs, lambda r: r.table("rollback_cost"), ["model", "context", "dropped"])
    first = runs.repeat(runs.repeats[0])
    grid, pts, shape = pays_grid(speed, ratios, shape_pair(first))
    return Study3Page(
        runs,
        findings,
        speedup=speed,
        cost_ratios=ratios,
        verify_cost=verify,
        rollback_cost=rollback,
        controlled=controlled,
        controlled_pays=pays,
        lookup=lookup,
        real_alpha=real_alpha,
        study6_alpha=s6,
        distill=runs.first("distill"),
        pays_grid=grid,
        pays_points=pts,
        shape_ratios=shape,
        eager_outliers=verdicts.implausible_eager(per_repeat, pair, []),
        quoted_repeat=quoted,
        real_tested_on=real_tested_on(first),
        shapes_tested_on=shapes_tested_on(first),
    )


def loop_ratio(controlled: pd.DataFrame, pair: tuple[str, str] = SEED_PAIR, batch: int = 1) -> float:
    """Target/draft of ``pair`` as the controlled loop ran it at ``batch``: 1 / the median c over its points, every γ
    and α (the c of the table of where each pair pays, ``tables.break_even_alpha``, and the controlled page's
    "target / draft step"); NaN where it did not run."""
    if controlled.empty:
        return float("nan")
    c = controlled[(controlled.draft == pair[0]) & (controlled.target == pair[1]) & (controlled.batch == batch)].c
    return 1 / float(c.median()) if len(c) else float("nan")


def with_f33_context(
    findings: list[Finding],
    per_repeat: list[tuple[str, pd.DataFrame]],
    ratios: pd.DataFrame,
    controlled: pd.DataFrame,
    pair: tuple[str, str] = SEED_PAIR,
) -> list[Finding]:
    """F3.3's note, once the repeats are combined, with what the reader needs to weigh it: a repeat whose eager ratio
    is not physically plausible (``verdicts.implausible_eager``) and why the cost mode's engine ratio is the one
    judged rather than the loop's (``verdicts.loop_ratio_sentence``); ``pair``: the shapes F3.3 judges."""
    out = []
    for f in findings:
        if f.id == "F3.3" and f.repeats:
            eager = ratios[(ratios.draft == pair[0]) & (ratios.target == pair[1]) & (ratios["mode"] == "hf_eager")]
            said = f.repeat_verdicts.split(";")
            extra = [
                verdicts.second_condition(per_repeat, pair, said),
                verdicts.implausible_eager(per_repeat, pair, said),
                verdicts.loop_ratio_sentence(
                    float(eager.target_over_draft.iloc[0]) if len(eager) else float("nan"),
                    loop_ratio(controlled, pair),
                    pair,
                ),
            ]
            note = ". ".join([f.note, *[e for e in extra if e]])
            f = replace(f, note=note)
        out.append(f)
    return out


def _best_speedup(speed: pd.DataFrame, runs: RunSet) -> tuple[str, str] | None:
    if speed.empty or speed.speedup.isna().all():
        return None
    best = speed.loc[speed["speedup"].idxmax()]
    # the best of the pooled table (each configuration's median over repeats), which F3.1's headline is not: that is
    # the median over repeats of each repeat's own best, a maximum per repeat, so it reads a little higher
    n = len(runs.part("real").repeats)
    over = f"; its median over {n} repeats" if n > 1 else ""
    return f"{best['speedup']:.2f} ×", (
        f"best speedup measured ({best['draft']} → {best['target']}, γ={best['gamma']}{over})"
    )


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The best speedup the generation sweep measured on a trained pair (median over repeats); None if none ran."""
    if not runs.measured:
        return None
    return _best_speedup(_pooled(runs, lambda r: speedup_of(r, cost_ratio_table(r)), SPEED_KEYS), runs)


def published(r: Study3Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited (the value is
    ``published_value(r.runs)``, read from the page's own pooled sweep rather than computed twice)."""
    value = _best_speedup(r.speedup, r.runs) if r.runs.measured else None
    return published_section(STUDY, value, r.device)


# ---- the page text ----


def goal_check(table: pd.DataFrame, target: str = "llama-3-8b") -> dict | None:
    """The issue's goal on ``target`` at α = 0.8, batch 1, best γ: the speedup, the prediction, whether it met
    ≥ 2.0× within 15% of the prediction. None if the point did not run."""
    if table.empty:
        return None
    s = table[(table.target == target) & (table.batch == 1) & (table.alpha.round(3) == GOAL_ALPHA)]
    if s.empty:
        return None
    best = s.loc[s.speedup.idxmax()]
    gap = 100 * (best.predicted_speedup - best.speedup) / best.predicted_speedup
    return dict(
        draft=best.draft,
        target=target,
        gamma=int(best.gamma),
        speedup=float(best.speedup),
        speedup_low=float(best.speedup_low),
        speedup_high=float(best.speedup_high),
        predicted=float(best.predicted_speedup),
        c=float(best.c),
        gap_pct=float(gap),
        verify_over_step=float(best.verify_over_step),
        loop_overhead_pct=float(best.loop_overhead_pct),
        met=bool(best.speedup >= GOAL_SPEEDUP and abs(gap) <= GOAL_WITHIN_PCT),
    )


def batch_goals(table: pd.DataFrame, target: str = "llama-3-8b") -> list[dict]:
    """The issue's goals at wider batches (``GOAL_BATCH_SPEEDUPS``) on ``target`` at α = 0.8, best γ: one dict per
    batch that ran (batch, goal, draft, gamma, speedup and its spread over timed rounds, met)."""
    out = []
    if table.empty:
        return out
    for batch, want in GOAL_BATCH_SPEEDUPS.items():
        s = table[(table.target == target) & (table.batch == batch) & (table.alpha.round(3) == GOAL_ALPHA)]
        if s.empty:
            continue
        best = s.loc[s.speedup.idxmax()]
        out.append(
            dict(
                batch=batch,
                goal=want,
                draft=best.draft,
                gamma=int(best.gamma),
                speedup=float(best.speedup),
                speedup_low=float(best.speedup_low),
                speedup_high=float(best.speedup_high),
                predicted=float(best.predicted_speedup),
                batch_tail=float(best.batch_tail) if "batch_tail" in best else float("nan"),
                met=bool(best.speedup >= want),
            )
        )
    return out


def batch_goal_sentence(goals: list[dict]) -> str:
    """The wider batches' goals in words, with the prediction and the batch's straggler tail ("" where none ran)."""
    out = []
    for g in goals:
        text = (
            f"At batch {g['batch']} (goal ≥ {g['goal']:g}×), best γ = {g['gamma']}: {g['speedup']:.2f}× (its timed "
            f"rounds {g['speedup_low']:.2f}–{g['speedup_high']:.2f}), which {'meets' if g['met'] else 'misses'} it, "
            f"against {g['predicted']:.2f}× predicted"
        )
        if g["batch_tail"] == g["batch_tail"] and g["batch_tail"] > 1:
            text += (
                f"; the batch ran {g['batch_tail']:.2f}× the verify steps its mean request needed (a closed batch "
                "waits for the request whose draws kept fewest, a cost the formula, a mean request's, does not "
                "price; a server refills the places)"
            )
        out.append(text + ".")
    return " ".join(out)


def goal_sentence(goal: dict | None, repeats: str = "") -> str:
    """The goal check in words; ``repeats``: what the point rests on ("measured in 1 of the 3 repeats")."""
    if goal is None:
        return "The 8B-shape point (α = 0.8, batch 1) was not measured."
    side = "below" if goal["gap_pct"] >= 0 else "above"  # gap_pct: how far the measured speedup falls short
    on = f", {repeats}" if repeats else ""
    return (
        f"{goal['draft']} → {goal['target']} at α = {GOAL_ALPHA}, batch 1, best γ = {goal['gamma']}{on}: "
        f"{goal['speedup']:.2f}× (its timed rounds {goal['speedup_low']:.2f}–{goal['speedup_high']:.2f}) against "
        f"{goal['predicted']:.2f}× predicted from c = {goal['c']:.3f} ({abs(goal['gap_pct']):.0f}% {side} it); "
        f"{goal_parts(goal)}. The verify step cost {goal['verify_over_step']:.2f} plain steps (the formula takes 1), "
        f"and {goal['loop_overhead_pct']:.0f}% of the wall time lay outside the draft and verify phases."
    )


def goal_parts(goal: dict) -> str:
    """Which part of the goal (≥ 2.0×, within 15% of Leviathan's prediction) the point meets, with its numbers. "It
    misses the goal: …, and its 4% gap is within 15%" listed a part it met as if it were a miss; the part missed is
    now named as such, the other as met."""
    fast = goal["speedup"] >= GOAL_SPEEDUP
    close = abs(goal["gap_pct"]) <= GOAL_WITHIN_PCT
    speed = f"the speedup {goal['speedup']:.2f}× is {'at least' if fast else 'below'} {GOAL_SPEEDUP}×"
    gap = (
        f"its {abs(goal['gap_pct']):.0f}% gap from the prediction is {'within' if close else 'more than'} "
        f"{GOAL_WITHIN_PCT:.0f}%"
    )
    goal_text = f"at least {GOAL_SPEEDUP}× and within {GOAL_WITHIN_PCT:.0f}% of the prediction"
    if fast and close:
        return f"it meets the goal ({goal_text}): {speed}, and {gap}"
    if not (fast or close):
        return f"it misses both parts of the goal ({goal_text}): {speed}, and {gap}"
    missed, met = (speed, gap) if not fast else (gap, speed)
    part = "the speed part" if not fast else "the prediction part"
    return f"it misses {part} of the goal ({goal_text}): {missed}; the other part is met, as {met}"


def real_alpha_sentence(real_alpha: pd.DataFrame) -> str:
    if real_alpha.empty:
        return ""
    parts = "; ".join(f"{r.draft} {r.alpha:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in real_alpha.itertuples())
    return (
        f"On SmolLM2-135M-Instruct (trained weights), α over {int(real_alpha.prompts.max())} held-out prompts "
        f"(95% bootstrap interval): {parts}."
    )


def repeat_count(pays: pd.DataFrame, draft: str, target: str, batch: int | None = None) -> tuple[int, int] | None:
    """The fewest and most repeats the pays table's rows of the pair (at ``batch``) rest on; None where it does not
    say."""
    if pays.empty or "n_repeats" not in pays:
        return None
    r = pays[(pays.draft == draft) & (pays.target == target) & ((pays.batch == batch) if batch else True)]
    ns = r.n_repeats.dropna().astype(int)
    return None if ns.empty else (int(ns.min()), int(ns.max()))


def count_text(n: tuple[int, int]) -> str:
    return str(n[0]) if n[0] == n[1] else f"{n[0]}–{n[1]}"


def seed_shapes_sentence(pays: pd.DataFrame) -> str:
    """Where the seed's pair pays at its shapes, from the pooled curves (the table "Where each pair pays"): the
    takeaway's sentence and the end of F3.1's and F3.3's notes alike."""
    seed = verdicts.seed_pair_pays(pays, SEED_PAIR) if len(pays) else ""
    if not seed:
        return ""
    n = repeat_count(pays, *SEED_PAIR)
    over = "" if n is None else "; one repeat" if n[1] == 1 else f"; each point's median over {count_text(n)} repeats"
    return f"At the seed's shapes (random weights, α controlled{over}), {seed}"


def quoted_repeat_sentence(findings: list[Finding], runs: RunSet, speed_of, pooled: pd.DataFrame) -> str:
    """F3.1 quotes one repeat whole; the speedup table gives each number's median over the repeats. Both, side by
    side, for the configuration F3.1 quotes: "can differ in the second decimal" stood where the intervals differed in
    the first (1.04–1.23 against 1.01–1.30). ``speed_of(repeat)``: that repeat's speedup table; ``pooled``: the
    page's. "" where F3.1 has no quoted repeat or the table lacks its configuration."""
    f = next((x for x in findings if x.id == "F3.1"), None)
    if f is None or pooled.empty or f.repeats < 2:
        return ""
    reps = [rep for rep in runs.per_repeat() if rep.has_parts(NEEDS["F3.1"])]
    for rep in reps:
        speed = speed_of(rep)
        best = verdicts.best_point(speed, None) if len(speed) else None
        if best is None:
            continue
        mine = verdicts.f31(speed, float("nan"), "", rep.device_name).measured_value.split(";")[0]
        if not f.measured_value.split("] ", 1)[-1].startswith(mine):
            continue
        key = (pooled.draft == best.draft) & (pooled.target == best.target) & (pooled.temperature == best.temperature)
        rows = pooled[key].dropna(subset=["speedup"])
        if rows.empty:
            return ""
        row = rows.loc[rows.speedup.idxmax()]
        greedy, mine_greedy = pooled[pooled.temperature == 0], speed[speed.temperature == 0]
        return (
            f"F3.1 quotes {runs.repeat_name(rep.repeats[0])} whole: its best configuration's 95% CI "
            f"{best.speedup_ci_low:.2f}–{best.speedup_ci_high:.2f} and α {mine_greedy.alpha.min():.2f}–"
            f"{mine_greedy.alpha.max():.2f} over its greedy configurations. The table of acceptance and speedup under "
            f"Details gives each number's median over the {len(reps)} repeats, where the same pair and temperature "
            f"read CI {row.speedup_ci_low:.2f}–{row.speedup_ci_high:.2f} at its best γ, and α ranges "
            f"{greedy.alpha.min():.2f}–{greedy.alpha.max():.2f} over the greedy configurations (the table shows each "
            "pair's best γ)."
        )
    return ""


def _finding_takeaway(f: Finding) -> str:
    """A verdict's sentence; where F3.2's median is near its threshold, which interval decides it (the Findings
    page's note says so too)."""
    reading = verdicts.near_threshold_reading(f)
    return f"{finding_sentence(f)} {reading}." if reading else finding_sentence(f)


def takeaways(r: Study3Page) -> str:
    """One sentence per verdict, the seed's pair by batch, the real pairs' α, the 8B-shape goal."""
    seed = seed_shapes_sentence(r.controlled_pays)
    goal = goal_check(r.controlled) if len(r.controlled) else None
    return takeaway_list(
        [_finding_takeaway(f) for f in r.findings]
        + [f"{seed}." if seed else ""]
        + [real_alpha_sentence(r.real_alpha)]
        + [goal_sentence(goal, goal_repeats(r, goal)) if len(r.controlled) else ""]
        + [batch_goal_sentence(batch_goals(r.controlled)) if len(r.controlled) else ""]
        + [r.quoted_repeat]
    )


def goal_repeats(r: Study3Page, goal: dict | None) -> str:
    """What the goal's point rests on, "measured in 1 of the 3 repeats" (its curve may have run in fewer repeats
    than the rest of the study)."""
    if goal is None:
        return ""
    return point_repeats(r.controlled_pays, len(r.runs.repeats), goal["draft"], goal["target"], 1)


def point_repeats(pays: pd.DataFrame, total: int, draft: str, target: str, batch: int | None = None) -> str:
    """What a controlled pair's points (at ``batch``) rest on, of the study's ``total`` repeats: "median over the 3
    repeats" or "measured in 1 of the 3 repeats"; "" where ``pays`` does not say."""
    n = repeat_count(pays, draft, target, batch)
    if n is None:
        return ""
    return (
        f"median over the {total} repeats"
        if n == (total, total)
        else f"measured in {count_text(n)} of the {total} repeats"
    )


def loop_audit(controlled: pd.DataFrame) -> str:
    """The batched loop's own counters, in words: the host syncs a round made (its design says 1) and how often the
    target's acceptance agreed with the controlled one (1 in exact arithmetic); "" where the sweep did not run."""
    if controlled.empty or "host_syncs_per_round" not in controlled:
        return ""
    keys = ["draft", "target", "batch"]
    syncs = controlled.groupby(keys, sort=False).host_syncs_per_round.max().dropna().astype(int)
    if syncs.empty:
        return ""
    lo, hi = int(syncs.min()), int(syncs.max())
    times = lambda n: f"{n} time" + ("s" if n != 1 else "")  # noqa: E731 - one phrase, twice
    if lo == hi:
        text = f"A round synced the host at most {times(lo)} at every pair and batch size"
    else:
        more = [f"{d} → {t} at batch {b}" for (d, t, b), n in syncs.items() if n > lo]
        text = f"A round synced the host at most {times(lo)}, except {times(hi)} for {', '.join(more)}"
    agree = controlled.dropna(subset=["agreement"])
    if len(agree):
        worst = agree.loc[agree.agreement.idxmin()]
        text += (
            f"; the target's own acceptance agreed with the controlled one in a median {agree.agreement.median():.0%}"
            f" of sequence-rounds per point (lowest {worst.agreement:.0%}: {worst.draft} → {worst.target} at batch "
            f"{int(worst.batch)}, γ = {int(worst.gamma)}, α = {worst.alpha:g}); the loop applies the controlled one"
        )
    return f"{text} (host syncs counted in a warm-up generation of every point; each point's median over repeats)."


def _round(df: pd.DataFrame, cols: dict, nd: int = 3) -> pd.DataFrame:
    keep = [c for c in cols if c in df.columns]
    return df[keep].rename(columns=cols).round(nd).reset_index(drop=True)


VIEW_ROWS = 12  # rows at most in the page's compact tables (every row is in the runs' tables)


def _view(df: pd.DataFrame, cols: dict, nd: int, rows: int | None = VIEW_ROWS) -> pd.DataFrame:
    """A compact table for the page: the first ``rows`` rows (all if None), ``cols`` renamed, rounded to ``nd``;
    empty where ``df`` is (a table that did not run has no columns to keep)."""
    if not len(df):
        return pd.DataFrame()
    return _round(df if rows is None else df.head(rows), cols, nd)


def speedup_view(speed: pd.DataFrame) -> pd.DataFrame:
    """At most a dozen rows: the greedy points, best γ per pair (every point is in the runs' generations)."""
    if speed.empty:
        return pd.DataFrame()
    s = speed.dropna(subset=["speedup"])
    best = s.loc[s.groupby(["target", "draft", "temperature"]).speedup.idxmax()]
    cols = {
        "draft": "draft",
        "target": "target",
        "temperature": "T",
        "gamma": "best γ",
        "alpha": "α",
        "speedup": "speedup (×)",
        "speedup_ci_low": "CI low",
        "speedup_ci_high": "CI high",
        "predicted_speedup": "predicted (×)",
        "speedup_vs_chained": "vs multi-step (×)",
        "prompts": "prompts",
    }
    return _round(best.head(VIEW_ROWS), cols, 2)


def ratios_view(ratios: pd.DataFrame) -> pd.DataFrame:
    """The cost ratios per pair and mode: the median ratio over repeats, and the step times of the repeat it is
    (``_at_median_repeat``), so that each row's times give its ratio."""
    cols = {
        "draft": "draft",
        "target": "target",
        "mode": "mode",
        "target_over_draft": "target/draft (×), median of repeats",
        "median_repeat": "the median's repeat",
        "draft_ms_at_median": "draft (ms), that repeat",
        "target_ms_at_median": "target (ms), that repeat",
        "target_over_draft_each": "target/draft in each repeat",
        "param_ratio": "parameters (×)",
    }
    return _view(ratios, cols, 3)


def ratios_note(r: Study3Page) -> str:
    """The cost-ratio table's reading: whose step times it shows, and a repeat whose eager ratio is not physically
    plausible (``eager_outliers``, as F3.3's note says it)."""
    if r.cost_ratios.empty:
        return ""
    text = (
        "*Each row's step times are those of the repeat whose ratio is the median over repeats, so they give that "
        "ratio; every repeat's ratio is in the column beside.*"
    )
    return f"{text} *{r.eager_outliers}.*" if r.eager_outliers else text


def pays_view(pays: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "draft": "draft",
        "target": "target",
        "batch": "batch",
        "alpha_pays": "pays above α",
        "best_speedup": "best speedup (×)",
        "c": "c in the loop (median, every γ and α)",
        "n_repeats": "repeats",
    }
    out = _view(pays, cols, 3)
    if out.empty or "alpha_max" not in pays:
        return out
    # no α up to the sweep's highest pays, or the lowest α set already does: say so, as the verdicts' notes do
    head = pays.head(VIEW_ROWS)
    never = head["alpha_pays"].isna().to_numpy()
    every = head["all_pay"].fillna(False).to_numpy(bool) if "all_pay" in head else np.zeros(len(head), bool)
    shown = out["pays above α"].astype(object)
    shown[never] = [f"not up to {a:.2f}" for a in head["alpha_max"].to_numpy()[never]]
    shown[every] = [f"every α measured, from {a:.2f}" for a in head["alpha_pays"].to_numpy()[every]]
    out["pays above α"] = shown
    return out


def alpha_view(real_alpha: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "draft": "proposer",
        "kind": "kind",
        "alpha": "α",
        "ci_low": "95% low",
        "ci_high": "95% high",
        "tokens_per_round": "tokens/round (γ=4)",
        "prompts": "prompts",
    }
    return _view(real_alpha, cols, 3)


def lookup_view(lookup: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "batch": "batch",
        "gamma": "γ",
        "tokens_per_s_plain": "plain (tok/s)",
        "tokens_per_s_lookup": "lookup (tok/s)",
        "speedup": "speedup (×)",
        # not the α of the real-acceptance table, where a search that finds nothing counts as a miss
        "alpha_realised": "α given a proposal",
        "proposed_share": "share of drafts proposed",
    }
    return _view(lookup, cols, 2)


def distill_view(distill: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "draft": "draft",
        "layers": "layers",
        "steps": "steps",
        "train_s": "training (s)",
        "first_loss": "first loss",
        "last_loss": "last loss",
        "cached": "from cache",
    }
    return _view(distill, cols, 2, rows=None)


def study6_note(s6: pd.DataFrame | None, device: str) -> str:
    from servelab.studies.s03_speculative.measured_alpha import measured_alpha_note

    return measured_alpha_note(s6, device)
