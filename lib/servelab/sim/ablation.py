"""Which GPU cost terms the simulator's accuracy rests on: Study 1's validation with each term left out.

Two terms price what Study 2's per-phase fit leaves out of a served step: the **padding** of a captured step
graph (a step runs the smallest bucket that holds it: ``StepCostModel.step_buckets``) and the **context a
prefill chunk reads** (``ms_per_chunk_context_token``, ``servelab.sim.context_reads``). ``term_ablation``
repeats ``validation.validation_table`` with neither, each alone and both, the serving terms refitted each
time on the same calibration runs, and reports the held-out median |error| of each variant: the before and
after that issue 7 asks for each term added to the model.
"""

from __future__ import annotations

import pandas as pd

from servelab.sim import study1_runs, validation

VARIANTS = {"neither": (False, False), "step-graph padding": (True, False), "context reads": (False, True),
            "both": (True, True)}


def term_ablation(requests: pd.DataFrame, steps: pd.DataFrame, limits: dict, cost_modes: list[str], *,
                  every: int = 2, outputs_for=None, deadline_s: float | None = None) -> tuple[pd.DataFrame, dict]:
    """``(table, fitted)``: one row per variant × model (and ``all``) with the median |error| (%) of the
    simulator with the serving terms (``gpu+overheads``) on the validation runs, over all metrics; and each
    variant's fitted cost models (``validation.validation_table``'s, keyed by variant)."""
    rows, fitted_by = [], {}
    models = sorted(requests["model"].unique())
    for name, (padding, reads) in VARIANTS.items():
        gpu = {}
        for m in models:
            found = study1_runs.gpu_cost_model(m, cost_modes, context_reads=reads)
            gpu[m] = found[0] if found else None
        kw = study1_runs.sim_kwargs_for({**limits, "step_graphs": bool(limits.get("step_graphs")) and padding})
        table, _, fitted_by[name] = validation.validation_table(requests, steps, gpu, sim_kwargs=kw, every=every,
                                                                outputs_for=outputs_for, deadline_s=deadline_s)
        summary = validation.error_summary(table)
        s = summary[(summary["cost_model"] == "gpu+overheads") & (summary["metric"] == "all")]
        held = s[s["subset"] == "validation"] if (s["subset"] == "validation").any() else s
        for _, r in held.iterrows():
            rows.append({"variant": name, "step_graph_padding": padding, "context_reads": reads, "model": r["model"],
                         "subset": r["subset"], "median_abs_error_pct": r["median_abs_error_pct"]})
    return pd.DataFrame(rows), fitted_by
