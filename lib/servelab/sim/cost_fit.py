"""A step-time cost model fitted from measured steps, for the simulator.

Per phase, from the prefill and decode rows (the form the simulator reads):

    prefill_ms(n, c) = a_p + b_p · n + k_p · n·(c + n/2)        n new tokens after c cached (per sequence, summed)
    decode_ms(B, C)  = a_d + b_d · B + k_d · C                   B sequences, C cached tokens in total

The ``n·(c + n/2)`` term is the number of causal query–key pairs, the attention work; ``C`` is the KV
read by decode attention.

One model of any step, from every row of the mode at once (prefill with and without context, decode, mixed):

    step_ms = a + a_chunk·[the step has a prefill chunk] + b_p·N_p + k_c·Σ n_i c_i + k_n·Σ n_i²/2 + b_d·B + k_d·C

with ``N_p = Σ n_i`` prefill tokens in chunks of ``n_i`` after ``c_i`` cached, ``Σ n_i c_i`` the attention pairs
of the chunks with their cached context (what chunked prefill and prefix caching add), ``Σ n_i²/2`` those
within the chunks, and ``B`` decodes reading ``C`` cached tokens in all. Its error is reported on held-out
rows: each row predicted by the model fitted to all the others (leave-one-out); the per-phase models' held-out
error is reported the same way.

Coefficients are fitted by non-negative least squares on *relative* error (each row weighted by 1/t), so short
steps count as much as long ones, and are stored per model and mode as data (JSON). The step model's keys
(``step``, ``step_error``) are additions: a JSON without them loads, and readers of the per-phase keys are
unaffected.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

PREFILL_TERMS = ("intercept_ms", "ms_per_token", "ms_per_attn_pair")
DECODE_TERMS = ("intercept_ms", "ms_per_seq", "ms_per_ctx_token")
STEP_TERMS = (
    "intercept_ms",
    "ms_per_prefill_step",
    "ms_per_prefill_token",
    "ms_per_context_pair",
    "ms_per_new_pair",
    "ms_per_decode",
    "ms_per_decode_ctx_token",
)


def _prefill_features(batch, new_tokens, context):
    batch, n, c = (np.asarray(x, dtype=float) for x in (batch, new_tokens, context))
    return np.column_stack([np.ones_like(n), batch * n, batch * n * (c + n / 2)])


def _decode_features(batch, context):
    batch, c = (np.asarray(x, dtype=float) for x in (batch, context))
    return np.column_stack([np.ones_like(batch), batch, batch * c])


def step_features(steps: pd.DataFrame) -> np.ndarray:
    """The step model's features (``STEP_TERMS`` order) of each row of a ``step_sweep`` frame."""
    phase = steps["phase"].to_numpy()
    b, n, c = (steps[k].to_numpy(dtype=float) for k in ("batch", "new_tokens", "context"))
    d = steps["decodes"].to_numpy(dtype=float) if "decodes" in steps else np.zeros(len(steps))
    dc = steps["decode_context"].to_numpy(dtype=float) if "decode_context" in steps else np.zeros(len(steps))
    decode = phase == "decode"
    chunk = ~decode  # prefill and mixed rows: batch·new_tokens prefill tokens after `context` cached
    z = np.zeros(len(steps))
    return np.column_stack(
        [
            np.ones(len(steps)),
            chunk.astype(float),
            np.where(chunk, b * n, z),
            np.where(chunk, b * n * c, z),
            np.where(chunk, b * n * n / 2, z),
            np.where(decode, b, d),
            np.where(decode, b * c, d * dc),
        ]
    )


def _fit(X, y):
    """Non-negative least squares on relative error; returns (coefficients, predictions, % errors)."""
    w = 1.0 / y  # relative error
    Xw = X * w[:, None]
    scale = np.abs(Xw).max(axis=0)
    scale[scale == 0] = 1.0  # an unused term (e.g. no context rows): its coefficient stays 0
    coef, _ = nnls(Xw / scale, y * w)
    coef = coef / scale
    pred = X @ coef
    err = 100.0 * (pred - y) / y
    return coef, pred, err


def leave_one_out(X, y) -> np.ndarray:
    """Each row's prediction by the model fitted to every other row (ms)."""
    keep = np.ones(len(y), dtype=bool)
    out = np.empty(len(y))
    for i in range(len(y)):
        keep[i] = False
        coef, _, _ = _fit(X[keep], y[keep])
        out[i] = X[i] @ coef
        keep[i] = True
    return out


def _abs_pct(err) -> tuple[float, float]:
    a = np.abs(err)
    return float(np.median(a)), float(np.max(a))


@dataclass
class CostModel:
    model: str
    mode: str
    prefill: dict
    decode: dict
    fit_error: dict  # median and max |relative error| in %, per phase (in sample; and median on held-out rows)
    step: dict = field(default_factory=dict)  # the one-model-for-any-step coefficients (STEP_TERMS); {} if not fitted
    step_error: dict = field(default_factory=dict)  # its median/max |error| in %, in-sample and held out, per phase

    @classmethod
    def fit(cls, steps: pd.DataFrame, model: str, mode: str) -> CostModel:
        """Fit from ``step_sweep`` rows (status ok) of one model and mode."""
        d = steps[(steps["model"] == model) & (steps["mode"] == mode) & (steps["status"] == "ok")]
        pre, dec = d[d["phase"] == "prefill"], d[d["phase"] == "decode"]
        if len(pre) < len(PREFILL_TERMS) or len(dec) < len(DECODE_TERMS):
            raise ValueError(f"too few points to fit {model}/{mode}: {len(pre)} prefill, {len(dec)} decode")
        Xp, yp = _prefill_features(pre["batch"], pre["new_tokens"], pre["context"]), pre["median_ms"].to_numpy(float)
        Xd, yd = _decode_features(dec["batch"], dec["context"]), dec["median_ms"].to_numpy(float)
        cp, _, ep = _fit(Xp, yp)
        cd, _, ed = _fit(Xd, yd)
        err = {
            "prefill_median_abs_pct": float(np.median(np.abs(ep))),
            "prefill_max_abs_pct": float(np.max(np.abs(ep))),
            "decode_median_abs_pct": float(np.median(np.abs(ed))),
            "decode_max_abs_pct": float(np.max(np.abs(ed))),
        }
        if len(pre) > len(PREFILL_TERMS) and len(dec) > len(DECODE_TERMS):  # each row predicted without itself
            err["prefill_heldout_median_abs_pct"] = _abs_pct(100.0 * (leave_one_out(Xp, yp) - yp) / yp)[0]
            err["decode_heldout_median_abs_pct"] = _abs_pct(100.0 * (leave_one_out(Xd, yd) - yd) / yd)[0]
        step, step_error = {}, {}
        if len(d) > len(STEP_TERMS):
            X, y = step_features(d), d["median_ms"].to_numpy(dtype=float)
            cs, _, es = _fit(X, y)
            eh = 100.0 * (leave_one_out(X, y) - y) / y
            step = dict(zip(STEP_TERMS, map(float, cs), strict=True))
            step_error = {"rows": int(len(d))}
            step_error["fit_median_abs_pct"], step_error["fit_max_abs_pct"] = _abs_pct(es)
            step_error["heldout_median_abs_pct"], step_error["heldout_max_abs_pct"] = _abs_pct(eh)
            phases = d["phase"].to_numpy()
            for ph in sorted(set(phases)):
                step_error[f"heldout_{ph}_median_abs_pct"] = _abs_pct(eh[phases == ph])[0]
        return cls(
            model,
            mode,
            dict(zip(PREFILL_TERMS, map(float, cp), strict=True)),
            dict(zip(DECODE_TERMS, map(float, cd), strict=True)),
            err,
            step,
            step_error,
        )

    def prefill_ms(self, new_tokens, context=0, batch=1):
        return _prefill_features(batch, new_tokens, context) @ np.array([self.prefill[k] for k in PREFILL_TERMS])

    def decode_ms(self, batch, context):
        """``context`` is per sequence; the model uses the total ``batch·context``."""
        return _decode_features(batch, context) @ np.array([self.decode[k] for k in DECODE_TERMS])

    def step_ms(self, steps: pd.DataFrame) -> np.ndarray:
        """The step model's predicted ms for each row of a ``step_sweep`` frame (any phase)."""
        if not self.step:
            raise ValueError(f"{self.model}/{self.mode} has no step model (too few rows to fit one)")
        return step_features(steps) @ np.array([self.step[k] for k in STEP_TERMS])

    def predict(self, steps: pd.DataFrame) -> np.ndarray:
        """Predicted ms for each row of a ``step_sweep`` frame, by the per-phase models.

        A mixed row is priced as the simulator prices it: its chunk's prefill time plus the decodes' per-sequence
        and context terms (no second intercept).
        """
        out = np.empty(len(steps))
        phase = steps["phase"].to_numpy()
        pre, dec, mixed = phase == "prefill", phase == "decode", phase == "mixed"
        s = steps[pre]
        out[pre] = self.prefill_ms(s["new_tokens"], s["context"], s["batch"])
        s = steps[dec]
        out[dec] = self.decode_ms(s["batch"], s["context"])
        if mixed.any():
            s = steps[mixed]
            out[mixed] = (
                self.prefill_ms(s["new_tokens"], s["context"], s["batch"])
                + self.decode_ms(s["decodes"], s["decode_context"])
                - self.decode["intercept_ms"]
            )
        return out

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls(**json.loads(Path(path).read_text()))


def fit_all(steps: pd.DataFrame) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Fit a cost model per (model, mode) that has both prefill and decode rows.

    Returns ``(models, predicted, summary)``: the fitted models keyed by ``(model, mode)``; the ok rows with
    ``predicted_ms`` (per-phase models), ``step_ms`` (the step model, fitted to all rows) and ``heldout_ms``
    (the step model fitted without that row); and one summary row per fit with its coefficients and errors.
    """
    ok = steps[steps["status"] == "ok"]
    models, parts, summary = {}, [], []
    for (m, mode), g in ok.groupby(["model", "mode"]):
        if not {"prefill", "decode"} <= set(g["phase"]):
            continue
        cm = CostModel.fit(g, m, mode)
        models[(m, mode)] = cm
        part = g.assign(predicted_ms=cm.predict(g))
        if cm.step:
            X, y = step_features(g), g["median_ms"].to_numpy(dtype=float)
            part = part.assign(step_ms=cm.step_ms(g), heldout_ms=leave_one_out(X, y))
        parts.append(part)
        summary.append(
            {
                "model": m,
                "mode": mode,
                **{f"prefill_{k}": v for k, v in cm.prefill.items()},
                **{f"decode_{k}": v for k, v in cm.decode.items()},
                **cm.fit_error,
                **{f"step_{k}": v for k, v in cm.step.items()},
                **{f"step_{k}": v for k, v in cm.step_error.items()},
            }
        )
    predicted = pd.concat(parts) if parts else ok.assign(predicted_ms=np.nan)
    return models, predicted, pd.DataFrame(summary)


def heldout_table(predicted: pd.DataFrame) -> pd.DataFrame:
    """Median and max |error| (%) of the step model on held-out rows, per model, mode and phase."""
    d = predicted.dropna(subset=["heldout_ms"]) if "heldout_ms" in predicted else predicted.iloc[:0]
    if d.empty:
        return pd.DataFrame(columns=["model", "mode", "phase", "rows", "heldout_median_abs_pct", "heldout_max_abs_pct"])
    d = d.assign(abs_pct=(100.0 * (d["heldout_ms"] - d["median_ms"]) / d["median_ms"]).abs())
    return (
        d.groupby(["model", "mode", "phase"])["abs_pct"]
        .agg(rows="size", heldout_median_abs_pct="median", heldout_max_abs_pct="max")
        .reset_index()
    )
