"""Study 2's page text from its run: the takeaways, and compact tables (about a dozen rows at most, units in the
headings; the full tables are the run's CSVs: ``steps.csv``, ``server_steps.csv``, ``cost_model_fit.csv``…)."""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.tested_on import model_name
from servelab.studies.s02_gpu_costs.run import Study2Run
from servelab_book.published import render_published


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
        f"{model_name(r.model)} {r.step_heldout_median_abs_pct:.1f}% median |error| (max "
        f"{r.step_heldout_max_abs_pct:.0f}%, {r.step_rows:.0f} steps)"
        for r in fits.itertuples()
    ]
    return (
        "The engine's step cost model, fitted for the simulator, predicts held-out steps to " + "; ".join(parts) + "."
    )


def takeaways(r: Study2Run) -> str:
    """One sentence per claim, then what graphs save the engine and how well its step cost model predicts."""
    return takeaway_list(
        [finding_sentence(f) for f in r.findings] + [launch_sentence(r.overhead), step_model_sentence(r.cost_fit)]
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
                "shortest prompt (tokens)": int(lo.new_tokens),
                "µs/token there": lo.us_per_token,
                "longest prompt (tokens)": int(hi.new_tokens),
                "µs/token at the longest": hi.us_per_token,
                "% of floor at the longest": hi.pct_of_floor,
            }
        )
    return pd.DataFrame(rows).round(2)


def modes_view(modes: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "median_ms": "median (ms)",
        "p25_ms": "p25 (ms)",
        "p75_ms": "p75 (ms)",
        "floor_ms": "floor (ms)",
        "pct_of_floor": "% of floor",
        "times_floor": "× floor",
    }
    return _short(modes).rename(columns=cols).round(3).reset_index(drop=True)


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


def kernel_view(kernel_profile: pd.DataFrame) -> pd.DataFrame:
    return _short(kernel_profile).round(2)


def fit_view(cost_fit: pd.DataFrame) -> pd.DataFrame:
    """Per model and mode: the fitted rows and the fits' errors (the coefficients are ``cost_model_*.json``)."""
    keep = [c for c in cost_fit.columns if c in ("model", "mode") or "pct" in c or c.endswith("rows")]
    return _short(cost_fit[keep]).round(1)


def heldout_view(heldout: pd.DataFrame) -> pd.DataFrame:
    cols = {"heldout_median_abs_pct": "median |error| (%)", "heldout_max_abs_pct": "max |error| (%)"}
    return _short(heldout).rename(columns=cols).round(1)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("02_gpu_costs")
