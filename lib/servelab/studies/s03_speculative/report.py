"""Study 3's page text, computed: what each verdict was measured on, the verdict table, the takeaways, the goal
check of the 8B-shape pair and the re-run recipe. The notebook calls these; it formats no numbers itself."""

from __future__ import annotations

import pandas as pd

from servelab.models.shape import ModelShape
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.s03_speculative import controlled
from servelab_book.published import render_published

GOAL_SPEEDUP = 2.0  # issue 21: at α = 0.8, batch 1, best γ, the 8B-shape target with the 0.5B-shape draft
GOAL_WITHIN_PCT = 15.0  # … within this of Leviathan's prediction
GOAL_ALPHA = 0.8


def family_tested_on(ms) -> str:
    """F3.1/F3.2's models: the model set the generation sweep ran (``pair.ModelSet``)."""
    size = {n: ModelShape.from_config(m.config).params / 1e6 for n, m in ms.hf.items()}
    drafts = ", ".join(f"{d} ({size[d]:.0f}M)" for d in ms.drafts)
    if ms.source == "trained family":
        return (
            f"the substitute family trained in this run on Python source (trained weights): target {ms.target} "
            f"({size[ms.target]:.0f}M), drafts {drafts}; not Qwen2"
        )
    return f"{ms.source}: target {ms.target} ({size[ms.target]:.0f}M), drafts {drafts}; prompts: {ms.prompt_source}"


def shapes_tested_on(P: dict) -> str:
    """F3.3's models: the seed's shapes whose cost ratio was measured, and the controlled-acceptance pairs."""
    shapes = ", ".join(f"{d.removeprefix('config:')} → {t.removeprefix('config:')}" for d, t in P["shape_pairs"])
    return f"random weights of the exact shapes {shapes} (cost ratio); {controlled.tested_on(P)}"


def goal_check(table: pd.DataFrame, target: str = "llama-3-8b") -> dict | None:
    """The issue's goal on ``target`` at α = 0.8, batch 1, best γ: the speedup, the prediction, whether it met
    ≥ 2.0× within 15% of the prediction. None if the point did not run."""
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


def goal_sentence(goal: dict | None) -> str:
    if goal is None:
        return "The 8B-shape point (α = 0.8, batch 1) did not run."
    verdict = "meets" if goal["met"] else "misses"
    return (
        f"{goal['draft']} → {goal['target']} at α = {GOAL_ALPHA}, batch 1, best γ = {goal['gamma']}: "
        f"{goal['speedup']:.2f}× (repeats {goal['speedup_low']:.2f}–{goal['speedup_high']:.2f}) against "
        f"{goal['predicted']:.2f}× predicted from c = {goal['c']:.3f} ({goal['gap_pct']:+.0f}% below it); it "
        f"{verdict} the goal of ≥ {GOAL_SPEEDUP}× within {GOAL_WITHIN_PCT:.0f}%. The verify step cost "
        f"{goal['verify_over_step']:.2f} plain steps (the formula takes 1), and {goal['loop_overhead_pct']:.0f}% "
        "of the wall time lay outside the draft and verify phases."
    )


def takeaways(findings, table: pd.DataFrame, pays: pd.DataFrame, seed_pair: tuple[str, str]) -> str:
    """Three to five sentences, every number from the run: one per verdict, the seed's pair by batch, the goal."""
    seed = controlled_sentence(pays, seed_pair)
    return takeaway_list(
        [finding_sentence(f) for f in findings]
        + [f"At the seed's shapes with α controlled, {seed}." if seed else ""]
        + [goal_sentence(goal_check(table)) if len(table) else ""]
    )


def controlled_sentence(pays: pd.DataFrame, pair: tuple[str, str]) -> str:
    from servelab.studies.s03_speculative.verdicts import seed_pair_pays

    return seed_pair_pays(pays, pair)


def rerun_recipe(slug: str = "03_speculative") -> str:
    """The re-run section: the papermill command and parameters cell, then the controlled-only entry."""
    from servelab_book.reproduce import rerun_markdown

    return rerun_markdown(slug) + (
        "\nOnly the controlled-acceptance sweep (writes `03_speculative/controlled_acceptance.csv`, its provenance "
        "in `03_speculative_controlled/run.json`):\n\n"
        "```bash\npython -m servelab.studies.s03_speculative.controlled --profile full\n```\n"
    )


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("03_speculative")
