"""What a step pays to read cached context, from Study 2's steps: a prefill chunk's, and a decode's.

Study 2's per-phase fit prices a prefill by its tokens and its query–key pairs, ``a + b·n + k·n(c + n/2)``,
from prompts timed from position 0. A chunk of ``n`` new tokens after ``c`` cached ones (the next chunk of a
long prompt, or a prompt whose system prompt hit the prefix cache) costs more than that on the engine's ragged
attention kernel, and the excess grows with ``c`` whatever ``n`` is: the kernel streams the cached keys of a
chunk in programs of one KV head each, too few to fill the GPU for a chunk of a few hundred tokens, so the
pairs do not set its time. On the H200 (Qwen2-0.5B shape), 128 and 512 new tokens after 2,048 cached each cost
about 2.3 ms more than from position 0. Several such chunks in one step run side by side, so a step pays for
its longest context (``StepCostModel`` takes ``max c``).

``fit_chunk_context`` prices that excess as ``ms_per_longest_context_token`` (ms per cached token): the robust
(soft-L1) fit, through the origin and non-negative, of each chunk-after-context step's time left over by the
per-phase fit, against its ``c``. It reads Study 2's ``steps.csv`` rows with ``phase == "prefill"`` and
``context > 0``, and the ``mixed`` rows with context, each against the same mixed step from position 0 (so that
the mixed step's own fixed cost, which the serving calibration prices, cancels).

Decodes have the same kind of cost in the decode kernel, one program per sequence and KV head walking its keys in
order: on the H200 one sequence of 16,384 tokens costs nearly as much as 64 of them (Qwen2-0.5B shape), where Study 2's
decode fit, ``a + b·B + k·Σc``, prices the one at a sixty-fourth of the context and so at barely more than its
intercept. ``fit_decode_walk`` refits the decode terms with the longest sequence's context beside them,
``a + b·B + k·Σc + w·max c`` (``ms_per_decode_walk_token``), on Study 2's decode steps.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from servelab.errors import ParameterError
from servelab.sim.cost_fit import DECODE_TERMS
from servelab.sim.cost_model import StepCostModel


def _timed(steps: pd.DataFrame, model: str, mode: str, phases) -> pd.DataFrame:
    """Study 2's steps of ``model`` in ``mode`` in one of ``phases`` that were timed (status ok, a median)."""
    s = steps[(steps["model"] == model) & (steps["mode"] == mode) & steps["phase"].isin(phases)]
    if "status" in s:
        s = s[s["status"] == "ok"]
    return s.dropna(subset=["median_ms"]).reset_index(drop=True)


def context_rows(steps: pd.DataFrame, model: str, mode: str) -> pd.DataFrame:
    """Study 2's timed steps of ``model`` in ``mode`` that prefill after cached context: ``new_tokens, context,
    batch, decodes, decode_context, median_ms`` (empty when there are none)."""
    need = {"model", "mode", "phase", "batch", "new_tokens", "context", "median_ms"}
    if not need <= set(steps.columns):
        raise ParameterError(f"Study 2's steps lack columns {sorted(need - set(steps.columns))}")
    s = _timed(steps, model, mode, ["prefill", "mixed"])
    return s[s["context"] > 0].reset_index(drop=True)


def _base_ms(base: StepCostModel, r, context: int) -> float:
    """``base``'s time (ms) for row ``r``'s step with its chunks after ``context`` cached tokens."""
    b, n = int(r["batch"]), int(r["new_tokens"])
    d = int(r.get("decodes", 0) or 0)
    dc = int(r.get("decode_context", 0) or 0)
    return base.gpu_ms(b * n, b * n * (context + n / 2), d, d * dc, b * n * context)


def fit_chunk_context(
    base: StepCostModel, rows: pd.DataFrame, fresh_mixed_ms: dict | None = None
) -> tuple[StepCostModel, dict]:
    """``base`` with ``ms_per_longest_context_token`` fitted to ``rows`` (``context_rows``), and the fit's
    statistics: rows, the coefficient, and the median |relative error| (%) of those steps before and after.
    A step's excess is its time less what ``base`` predicts for it; for a mixed row, less the same mixed step
    from position 0 as Study 2 timed it (``fresh_mixed_ms[(new_tokens, decodes)]``) plus what ``base`` adds
    for the context, so that the mixed step's own fixed cost cancels (rows without that reference are left out)."""
    rows = rows[rows["context"] > 0]
    if rows.empty:
        raise ParameterError("no chunk-after-context steps to fit (Study 2 timed none for this model and mode)")
    excess, reads, measured = [], [], []
    for _, r in rows.iterrows():
        c = int(r["context"])
        if r["phase"] == "mixed":
            ref = (fresh_mixed_ms or {}).get((int(r["new_tokens"]), int(r.get("decodes", 0))))
            if ref is None:
                continue
            without = ref + _base_ms(base, r, c) - _base_ms(base, r, 0)
        else:
            without = _base_ms(base, r, c)
        excess.append(float(r["median_ms"]) - without)
        reads.append(float(c))
        measured.append(float(r["median_ms"]))
    y, x, t = np.asarray(excess), np.asarray(reads), np.asarray(measured)
    if not len(y):
        raise ParameterError("no usable chunk-after-context steps")
    sol = least_squares(
        lambda k: (k[0] * x - y) / t,
        x0=[max(float(np.median(y / x)), 0.0)],
        bounds=([0], [np.inf]),
        loss="soft_l1",
        f_scale=0.05,
    )
    k = float(sol.x[0])
    model = base.with_overheads(
        ms_per_longest_context_token=k, source=f"{base.source} + {k * 1e3:.3g} µs per cached token a chunk reads"
    )
    return model, {
        "rows": int(len(y)),
        "ms_per_longest_context_token": k,
        "median_abs_pct_before": float(100 * np.median(np.abs(y) / t)),
        "median_abs_pct_after": float(100 * np.median(np.abs(y - k * x) / t)),
    }


def fit_decode_walk(
    base: StepCostModel, steps: pd.DataFrame, model: str, mode: str
) -> tuple[StepCostModel, dict | None]:
    """``base`` with its decode terms refitted to Study 2's decode steps of ``model`` in ``mode`` together with
    ``ms_per_decode_walk_token`` (every term >= 0, least squares on relative residuals), and the fit's
    statistics: rows, the four terms, the median |relative error| (%) of those steps before and after.
    ``base`` unchanged and None where there is nothing to refit: fewer decode steps than terms, or a cost model
    whose decode terms come from Study 2's one model of any step (``gpu_form="step"``)."""
    need = {"model", "mode", "phase", "batch", "context", "median_ms"}
    if base.gpu_form != "phase" or not need <= set(steps.columns):
        return base, None
    d = _timed(steps, model, mode, ["decode"])
    if len(d) < 5:
        return base, None
    b, c, y = (d[k].to_numpy(float) for k in ("batch", "context", "median_ms"))
    X = np.column_stack([np.ones(len(y)), b, b * c, c])
    a_d, b_d, k_d = (float(base.gpu.decode[k]) for k in DECODE_TERMS)
    before = X[:, :3] @ np.array([a_d, b_d, k_d])
    start = np.array([a_d, b_d, k_d, 0.0]).clip(min=0)
    coef = least_squares(lambda w: (X @ w - y) / y, x0=start, bounds=(0, np.inf), x_scale="jac").x
    gpu = replace(base.gpu, decode=dict(zip(DECODE_TERMS, map(float, coef[:3]), strict=True)))
    w = float(coef[3])
    model_ = replace(base, gpu=gpu).with_overheads(
        ms_per_decode_walk_token=w,
        source=f"{base.source} + decode terms refitted with {w * 1e3:.3g} µs per token of the longest sequence",
    )
    return model_, {
        "rows": int(len(y)),
        **dict(zip(DECODE_TERMS, map(float, coef[:3]), strict=True)),
        "ms_per_decode_walk_token": w,
        "median_abs_pct_before": float(100 * np.median(np.abs(before - y) / y)),
        "median_abs_pct_after": float(100 * np.median(np.abs(X @ coef - y) / y)),
    }


def with_context_reads(
    base: StepCostModel, steps: pd.DataFrame | None, model: str, mode: str
) -> tuple[StepCostModel, dict | None]:
    """``base`` priced for context reads from Study 2's ``steps``: its decode terms refitted with the longest
    sequence (``fit_decode_walk``) where Study 2 timed decode steps of ``model`` in ``mode``, and the context
    chunks read (``fit_chunk_context``) where it timed chunk-after-context steps; the second fit's statistics,
    or None without chunk-after-context steps (older Study 2 runs)."""
    if steps is None:
        return base, None
    base = fit_decode_walk(base, steps, model, mode)[0]
    rows = context_rows(steps, model, mode)
    if rows.empty:
        return base, None
    fresh = steps[
        (steps["model"] == model) & (steps["mode"] == mode) & (steps["phase"] == "mixed") & (steps["context"] == 0)
    ]
    ref = {(int(r["new_tokens"]), int(r["decodes"])): float(r["median_ms"]) for _, r in fresh.iterrows()}
    return fit_chunk_context(base, rows, ref)


def mixed_step_excess(model: StepCostModel, features: pd.DataFrame) -> pd.DataFrame:
    """Where a served step's context reads show: each mixed step of ``features`` (``calibration.step_features``
    of a server's step log: prefill chunks and decodes in one step) with its measured time less what ``model``
    prices for it without the longest walk and without the mixed-step cost (``excess_ms``), beside the step's
    longest context (``longest_context``) and ``model``'s price of the two (``priced_ms``). Against the longest
    context, the excess shows what a decode beside a chunk costs the ragged kernel."""
    from servelab.sim.calibration import predict_cycles  # calibration builds on this module

    f = features[(features["prefill_tokens"] > 0) & (features["decode_tokens"] > 0)].reset_index(drop=True)
    if f.empty:
        return pd.DataFrame(columns=["longest_context", "cycle_ms", "excess_ms", "priced_ms"])
    bare = predict_cycles(model.with_overheads(ms_per_longest_context_token=0.0, mixed_step_ms=0.0), f)
    y = f["cycle_ms"].to_numpy(float)
    return pd.DataFrame(
        {
            "longest_context": f["longest_context"].to_numpy(float),
            "cycle_ms": y,
            "excess_ms": y - bare,
            "priced_ms": predict_cycles(model, f) - bare,
        }
    )


def excess_by_context(excess: pd.DataFrame, width: int = 1000, min_steps: int = 5) -> pd.DataFrame:
    """``excess`` (``mixed_step_excess``) in bins of ``width`` tokens of longest context, those of at least
    ``min_steps`` steps: ``longest_context`` (median), ``steps``, the excess's quartiles ``q25, q50, q75`` and
    the model's median price ``priced_ms``."""
    g = excess.groupby((excess["longest_context"] // width).astype(int))
    out = pd.DataFrame(
        {
            "longest_context": g["longest_context"].median(),
            "steps": g.size(),
            "q25": g["excess_ms"].quantile(0.25),
            "q50": g["excess_ms"].median(),
            "q75": g["excess_ms"].quantile(0.75),
            "priced_ms": g["priced_ms"].median(),
        }
    )
    return out[out["steps"] >= min_steps].reset_index(drop=True)


def decode_walk_check(base: StepCostModel, steps: pd.DataFrame, model: str, mode: str) -> pd.DataFrame:
    """Study 2's decode steps of ``model`` in ``mode``, measured against its decode fit as stored (``before``)
    and refitted with the longest sequence (``after``, ``fit_decode_walk``): ``batch, context, measured_ms,
    before_ms, after_ms`` (empty where there is nothing to refit)."""
    refit, stats = fit_decode_walk(base, steps, model, mode)
    if stats is None:
        return pd.DataFrame(columns=["batch", "context", "measured_ms", "before_ms", "after_ms"])
    rows = []
    for _, r in _timed(steps, model, mode, ["decode"]).iterrows():
        b, c = int(r["batch"]), int(r["context"])
        rows.append(
            {
                "batch": b,
                "context": c,
                "measured_ms": float(r["median_ms"]),
                "before_ms": base.gpu_ms(0, 0.0, b, b * c),
                "after_ms": refit.gpu_ms(0, 0.0, b, b * c, 0.0, c),
            }
        )
    return pd.DataFrame(rows)
