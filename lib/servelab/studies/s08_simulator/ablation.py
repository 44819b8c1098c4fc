"""Which GPU cost terms the simulator's accuracy rests on: Study 1's validation with each term left out.

Two terms price what Study 2's per-phase fit leaves out of a served step: the **padding** of a captured step
graph (a step runs the smallest bucket that holds it: ``StepCostModel.step_buckets``) and the **context reads**,
each step's longest walk over cached keys (a chunk's or a decode's in a step with prefill,
``ms_per_longest_context_token``; the longest sequence's in a decode-only step, ``ms_per_decode_walk_token``;
``servelab.studies.s08_simulator.context_reads``; for a model Study 2 did not cost, the step-log fit's terms of
both kinds). ``term_ablation`` repeats ``validation.validation_table`` with neither, each alone and both, the
serving terms refitted each time on the same calibration runs, and reports the held-out median |error| of each
variant: the before and after of each term added to the model.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s08_simulator import study1_runs, validation

VARIANTS = {
    "neither": (False, False),
    "step-graph padding": (True, False),
    "context reads": (False, True),
    "both": (True, True),
}


def term_ablation(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    limits: dict,
    gpu_models,
    *,
    every: int = 2,
    outputs_for=None,
    deadline_s: float | None = None,
    known: dict | None = None,
) -> tuple[pd.DataFrame, dict]:
    """``gpu_models(context_reads)``: Study 2's cost model of each model (None where it has none), priced for
    context reads or not; ``known``: variants already validated, ``{name: (table, calib, fitted)}`` (not redone).
    ``(table, fitted)``: one row per variant × model (and ``all``) with the median |error| (%) of the
    simulator with the serving terms (``gpu+overheads``) on the validation runs, over all metrics, and the
    median |error| of its step times on the calibration runs' step log (``step_median_abs_pct``; for ``all``,
    the median over the models); and each variant's fitted cost models (``validation.validation_table``'s,
    keyed by variant)."""
    rows, fitted_by = [], {}
    for name, (padding, reads) in VARIANTS.items():
        if known and name in known:
            table, calib, fitted_by[name] = known[name]
        else:
            kw = study1_runs.sim_kwargs_for({**limits, "step_graphs": bool(limits.get("step_graphs")) and padding})
            table, calib, fitted_by[name] = validation.validation_table(
                requests,
                steps,
                gpu_models(reads),
                sim_kwargs=kw,
                every=every,
                outputs_for=outputs_for,
                deadline_s=deadline_s,
                context_reads=reads,
                replayed=("gpu+overheads",),  # the only one the ablation reports, on the held-out runs
                held_out_only=True,
            )
        summary = validation.error_summary(table)
        s = summary[(summary["cost_model"] == "gpu+overheads") & (summary["metric"] == "all")]
        held = s[s["subset"] == "validation"] if (s["subset"] == "validation").any() else s
        step_err = (
            calib.set_index("model")["step_median_abs_pct"]
            if "step_median_abs_pct" in calib
            else pd.Series(dtype=float)
        )
        for _, r in held.iterrows():
            rows.append(
                {
                    "variant": name,
                    "step_graph_padding": padding,
                    "context_reads": reads,
                    "model": r["model"],
                    "subset": r["subset"],
                    "median_abs_error_pct": r["median_abs_error_pct"],
                    "step_median_abs_pct": step_err.get(
                        r["model"], step_err.median() if r["model"] == "all" and len(step_err) else float("nan")
                    ),
                }
            )
    return pd.DataFrame(rows), fitted_by
