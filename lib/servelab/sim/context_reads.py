"""What a prefill chunk pays to read its cached context, from Study 2's chunk-after-context steps.

Study 2's per-phase fit prices a prefill by its tokens and its query–key pairs, ``a + b·n + k·n(c + n/2)``,
from prompts timed from position 0. A chunk of ``n`` new tokens after ``c`` cached ones (the next chunk of a
long prompt, or a prompt whose system prompt hit the prefix cache) costs more than that on the engine's ragged
attention kernel, and the excess grows with ``c`` whatever ``n`` is: the kernel streams the cached keys of a
chunk in programs of one KV head each, too few to fill the GPU for a chunk of a few hundred tokens, so the
pairs do not set its time. On the H200 (Qwen2-0.5B shape), 128 and 512 new tokens after 2,048 cached each cost
about 2.3 ms more than from position 0. Several such chunks in one step run side by side, so a step pays for
its longest context (``StepCostModel`` takes ``max c``).

``fit_chunk_context`` prices that excess as ``ms_per_chunk_context_token`` (ms per cached token): the robust
(soft-L1) fit, through the origin and non-negative, of each chunk-after-context step's time left over by the
per-phase fit, against its ``c``. It reads Study 2's ``steps.csv`` rows with ``phase == "prefill"`` and
``context > 0``, and the ``mixed`` rows with context, each against the same mixed step from position 0 (so that
the mixed step's own fixed cost, which the serving calibration prices, cancels).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from servelab.profiles import ParameterError
from servelab.sim.cost_model import StepCostModel


def context_rows(steps: pd.DataFrame, model: str, mode: str) -> pd.DataFrame:
    """Study 2's timed steps of ``model`` in ``mode`` that prefill after cached context: ``new_tokens, context,
    batch, decodes, decode_context, median_ms`` (empty when there are none)."""
    need = {"model", "mode", "phase", "batch", "new_tokens", "context", "median_ms"}
    if not need <= set(steps.columns):
        raise ParameterError(f"Study 2's steps lack columns {sorted(need - set(steps.columns))}")
    s = steps[(steps["model"] == model) & (steps["mode"] == mode) & (steps["context"] > 0)
              & steps["phase"].isin(["prefill", "mixed"])]
    if "status" in s:
        s = s[s["status"] == "ok"]
    return s.dropna(subset=["median_ms"]).reset_index(drop=True)


def _base_ms(base: StepCostModel, r, context: int) -> float:
    """``base``'s time (ms) for row ``r``'s step with its chunks after ``context`` cached tokens."""
    b, n = int(r["batch"]), int(r["new_tokens"])
    d = int(r.get("decodes", 0) or 0)
    dc = int(r.get("decode_context", 0) or 0)
    return base.gpu_ms(b * n, b * n * (context + n / 2), d, d * dc, b * n * context)


def fit_chunk_context(base: StepCostModel, rows: pd.DataFrame, fresh_mixed_ms: dict | None = None
                      ) -> tuple[StepCostModel, dict]:
    """``base`` with ``ms_per_chunk_context_token`` fitted to ``rows`` (``context_rows``), and the fit's
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
    sol = least_squares(lambda k: (k[0] * x - y) / t, x0=[max(float(np.median(y / x)), 0.0)], bounds=([0], [np.inf]),
                        loss="soft_l1", f_scale=0.05)
    k = float(sol.x[0])
    model = base.with_overheads(ms_per_chunk_context_token=k,
                                source=f"{base.source} + {k * 1e3:.3g} µs per cached token a chunk reads")
    return model, {"rows": int(len(y)), "ms_per_chunk_context_token": k,
                   "median_abs_pct_before": float(100 * np.median(np.abs(y) / t)),
                   "median_abs_pct_after": float(100 * np.median(np.abs(y - k * x) / t))}


def with_context_reads(base: StepCostModel, steps: pd.DataFrame | None, model: str, mode: str
                       ) -> tuple[StepCostModel, dict | None]:
    """``base`` priced for context reads from Study 2's ``steps`` when it timed chunk-after-context steps of
    ``model`` in ``mode``; ``base`` unchanged and None otherwise (older Study 2 runs)."""
    if steps is None:
        return base, None
    rows = context_rows(steps, model, mode)
    if rows.empty:
        return base, None
    fresh = steps[(steps["model"] == model) & (steps["mode"] == mode) & (steps["phase"] == "mixed")
                  & (steps["context"] == 0)]
    ref = {(int(r["new_tokens"]), int(r["decodes"])): float(r["median_ms"]) for _, r in fresh.iterrows()}
    return fit_chunk_context(base, rows, ref)
