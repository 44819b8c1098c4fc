"""A step-time cost model fitted from measured steps, for the simulator.

    prefill_ms(n, c) = a_p + b_p · n + k_p · n·(c + n/2)        n new tokens after c cached (per sequence, summed)
    decode_ms(B, C)  = a_d + b_d · B + k_d · C                   B sequences, C cached tokens in total

The ``n·(c + n/2)`` term is the number of causal query–key pairs, the attention work; ``C`` is the KV
read by decode attention. Coefficients are fitted by non-negative least squares on *relative* error (each
row weighted by 1/t), so short steps count as much as long ones, and are stored per model and mode as data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, asdict
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

PREFILL_TERMS = ("intercept_ms", "ms_per_token", "ms_per_attn_pair")
DECODE_TERMS = ("intercept_ms", "ms_per_seq", "ms_per_ctx_token")


def _prefill_features(batch, new_tokens, context):
    batch, n, c = (np.asarray(x, dtype=float) for x in (batch, new_tokens, context))
    return np.column_stack([np.ones_like(n), batch * n, batch * n * (c + n / 2)])


def _decode_features(batch, context):
    batch, c = (np.asarray(x, dtype=float) for x in (batch, context))
    return np.column_stack([np.ones_like(batch), batch, batch * c])


def _fit(X, y):
    w = 1.0 / y  # relative error
    coef, _ = nnls(X * w[:, None], y * w)
    pred = X @ coef
    err = 100.0 * (pred - y) / y
    return coef, pred, err


@dataclass
class CostModel:
    model: str
    mode: str
    prefill: dict
    decode: dict
    fit_error: dict  # median and max |relative error| in %, per phase

    @classmethod
    def fit(cls, steps: pd.DataFrame, model: str, mode: str) -> "CostModel":
        """Fit from ``step_sweep`` rows (status ok) of one model and mode."""
        d = steps[(steps["model"] == model) & (steps["mode"] == mode) & (steps["status"] == "ok")]
        pre, dec = d[d["phase"] == "prefill"], d[d["phase"] == "decode"]
        if len(pre) < len(PREFILL_TERMS) or len(dec) < len(DECODE_TERMS):
            raise ValueError(f"too few points to fit {model}/{mode}: {len(pre)} prefill, {len(dec)} decode")
        cp, _, ep = _fit(_prefill_features(pre["batch"], pre["new_tokens"], pre["context"]), pre["median_ms"].to_numpy())
        cd, _, ed = _fit(_decode_features(dec["batch"], dec["context"]), dec["median_ms"].to_numpy())
        err = {"prefill_median_abs_pct": float(np.median(np.abs(ep))), "prefill_max_abs_pct": float(np.max(np.abs(ep))),
               "decode_median_abs_pct": float(np.median(np.abs(ed))), "decode_max_abs_pct": float(np.max(np.abs(ed)))}
        return cls(model, mode, dict(zip(PREFILL_TERMS, map(float, cp))), dict(zip(DECODE_TERMS, map(float, cd))), err)

    def prefill_ms(self, new_tokens, context=0, batch=1):
        return _prefill_features(batch, new_tokens, context) @ np.array([self.prefill[k] for k in PREFILL_TERMS])

    def decode_ms(self, batch, context):
        """``context`` is per sequence; the model uses the total ``batch·context``."""
        return _decode_features(batch, context) @ np.array([self.decode[k] for k in DECODE_TERMS])

    def predict(self, steps: pd.DataFrame) -> np.ndarray:
        """Predicted ms for each row of a ``step_sweep`` frame."""
        out = np.empty(len(steps))
        pre = (steps["phase"] == "prefill").to_numpy()
        s = steps[pre]
        out[pre] = self.prefill_ms(s["new_tokens"], s["context"], s["batch"])
        s = steps[~pre]
        out[~pre] = self.decode_ms(s["batch"], s["context"])
        return out

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        return cls(**json.loads(Path(path).read_text()))


def fit_all(steps: pd.DataFrame) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Fit a cost model per (model, mode) that has both phases.

    Returns ``(models, predicted, summary)``: the fitted models keyed by ``(model, mode)``, the ok rows with a
    ``predicted_ms`` column, and one summary row per fit with its coefficients and errors.
    """
    ok = steps[steps["status"] == "ok"]
    models, parts, summary = {}, [], []
    for (m, mode), g in ok.groupby(["model", "mode"]):
        if set(g["phase"]) != {"prefill", "decode"}:
            continue
        cm = CostModel.fit(g, m, mode)
        models[(m, mode)] = cm
        parts.append(g.assign(predicted_ms=cm.predict(g)))
        summary.append({"model": m, "mode": mode, **{f"prefill_{k}": v for k, v in cm.prefill.items()},
                        **{f"decode_{k}": v for k, v in cm.decode.items()}, **cm.fit_error})
    predicted = pd.concat(parts) if parts else ok.assign(predicted_ms=np.nan)
    return models, predicted, pd.DataFrame(summary)
