"""Study 6's page text from a run: the verdict table, the takeaways and the detail tables, each one call.

Every sentence's numbers come from the run's tables (``study.Study6``); nothing here measures.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s06_hf_assisted.plots import METHOD_LABELS
from servelab_book.published import render_published


def verdict_table(findings) -> pd.DataFrame:
    """Claim, RTX 2070 value, this run's value, verdict and what it was measured on."""
    return pd.DataFrame(
        [
            {
                "claim": f"{f.id}: {f.claim}",
                "RTX 2070 (seed)": f.seed_value,
                "measured": f"{f.measured_value} {f.unit}",
                "verdict": f.verdict,
                "tested on": f.tested_on,
            }
            for f in findings
        ]
    ).set_index("claim")


def alpha_sentence(real_alpha: pd.DataFrame | None) -> str:
    if real_alpha is None or real_alpha.empty:
        return "α with intervals was not measured (no distilled drafts: hub specs were given)."
    best = real_alpha.loc[real_alpha["alpha"].idxmax()]
    parts = "; ".join(f"{r.draft} {r.alpha:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in real_alpha.itertuples())
    return (
        f"Greedy acceptance α on {int(best['prompts'])} held-out prompts (95% bootstrap interval over prompts): "
        f"{parts}. The best, {best['draft']}, emits {best['tokens_per_round']:.2f} tokens per target forward at "
        f"γ = {int(best['gamma'])}."
    )


def _speed_sentence(speedups: pd.DataFrame, method: str) -> str | None:
    d = speedups[speedups["method"] == method] if len(speedups) else speedups
    if d.empty:
        return None
    top = d[d["length"] == d["length"].max()]
    best = top.loc[top["speedup_median"].idxmax()]
    return (
        f"{METHOD_LABELS.get(method, method)}: best {best['pair']} at {int(best['length'])} tokens, "
        f"{best['speedup_median']:.2f}× plain HF generate (median of {int(best['prompts'])} prompts)."
    )


def takeaways(S) -> str:
    """Three to five sentences: each verdict, α, the engine against HF, the seed shapes' cost ratio."""
    out = [f"**{f.id} {f.verdict}.** {f.note}." for f in S.findings]
    out.append(alpha_sentence(S.tables.get("real_alpha")))
    for method in ("prompt_lookup", "own"):
        text = _speed_sentence(S.tables["speedups"], method)
        if text:
            out.append(text)
    return "\n\n".join(out[:5])


def alpha_detail(S) -> pd.DataFrame:
    """The α table as shown: per draft, its kind, α and interval, prompts and tokens per round."""
    a = S.tables.get("real_alpha")
    if a is None or a.empty:
        return S.tables["alpha"].groupby("pair")["alpha"].median().to_frame()
    cols = ["kind", "alpha", "ci_low", "ci_high", "prompts", "positions", "gamma", "tokens_per_round"]
    return a.set_index("draft")[cols].round(3)


def what_ran(S) -> pd.DataFrame:
    """Prompts measured per method, pair and output length (0: not measured at that length)."""
    return S.tables["coverage"]


def engine_table(S) -> pd.DataFrame:
    """The project's engine: its speculative decoder over the engine running the target alone, longest length."""
    d = S.tables["own_vs_engine"]
    if d.empty:
        return d
    return d[d["length"] == d["length"].max()][["pair", "length", "speedup_median", "prompts"]].round(2)


def rank_length(S) -> int | None:
    """The output length at which the pairs are compared by cost ratio (see ``verdicts.ranking_length``)."""
    from servelab.studies.s06_hf_assisted.verdicts import min_prompts_for, ranking_length

    return ranking_length(S.tables["pairs"], min_prompts_for(S.P["profile"], S.P["n_prompts"]))


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("06_hf_assisted")
