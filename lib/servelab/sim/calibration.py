"""Fitting the simulator's cost terms from a real server's step log (Study 1's ``steps.csv`` and ``requests.csv``).

The step log has, per engine step, ``start_s, end_s, prefill_tokens, decode_tokens, num_seqs``; the engine's
``StepRecord`` also logs ``prefill_context_tokens`` (Σ n_i c_i) and ``decode_context_tokens`` (Σ over decodes of
the tokens each attends to). Where a run's log has them they are used as logged; otherwise (older logs, or a
server that does not fill them) they are reconstructed from the same run's request records, and the
within-chunk pairs Σ n_i²/2, which no log holds, always are:

- decode context of a step = its decode count × the mean context (prompt + tokens received so far − the one
  being decoded) of the requests that were between their first and last token at the step's midpoint;
- prefill query–key pairs of a step, ``Σ n_i(c_i + n_i/2)`` over its chunks of ``n_i`` new tokens after
  ``c_i`` cached ones: every policy admits requests in arrival order, so the prompts, taken in send order and
  laid end to end, are the stream the steps' prefill tokens consume; each step's ``P`` prefill tokens are the
  next ``P`` of that stream, which says which prompts (and which part of each) they were. A recompute after a
  preemption re-prefills tokens the stream does not hold; they are counted as context 0.

The quantity fitted is a step's **cycle time**: from its start to the next step's start, whenever the engine
had work left: the next step followed within ``busy_gap_ms``, or some request was still outstanding (sent and
not finished, by the client's records) halfway through the gap. A gap the server spends elsewhere while
requests wait (handing tokens to HTTP streams, taking in new requests) is part of what a step costs; idle time
is not. That is the time the simulator charges per step.

- ``fit_overheads``: with Study 2's GPU model, the cycle is fitted as ``prefill_scale · PREFILL + DECODE +
  ms_per_context_pair · P·c + mixed_step_ms · [mixed] + step_overhead_ms + seq_overhead_ms · num_seqs``, the
  prefill intercept scaled on its own (``prefill_fixed_scale``) (see ``servelab.sim.cost_model``; non-negative,
  robust soft-L1 loss on relative error);
- ``fit_step_log_model``: for a model Study 2 did not measure, the whole ``CostModel`` form fitted to the
  cycle times, with the fixed cost of a mixed step (non-negative, robust soft-L1 loss on relative error).

Fit on calibration runs only; the notebook validates each run with terms fitted on the *other* runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from servelab.errors import ParameterError
from servelab.loadgen.metrics import check_records
from servelab.sim.cost_fit import DECODE_TERMS, PREFILL_TERMS, CostModel
from servelab.sim.cost_model import StepCostModel

STEP_LOG_COLUMNS = ("start_s", "end_s", "prefill_tokens", "decode_tokens", "num_seqs")


def step_features(
    steps: pd.DataFrame, records: pd.DataFrame, *, busy_gap_ms: float = 1.0, step_buckets=None
) -> pd.DataFrame:
    """One row per step of one run that was followed at once by another: ``cycle_ms``, ``prefill_tokens``,
    ``prefill_pairs`` (Σ n(c + n/2)), ``context_pairs`` (Σ n·c), ``longest_context`` (the most cached tokens
    one chunk or decode of a step with prefill reads, reconstructed),
    ``decode_tokens``, ``decode_context`` (reconstructed), ``num_seqs``, and ``pad_tokens``: the padding of a
    step with prefill up to the smallest of ``step_buckets`` (the server's captured step sizes) that holds it.

    ``steps`` and ``records`` must share a clock (s from the run's start). Rows of multi-step decode groups
    (``decode_steps > 1``) are left out."""
    missing = [c for c in STEP_LOG_COLUMNS if c not in steps.columns]
    if missing:
        raise ParameterError(f"step log lacks columns {missing}; needs {list(STEP_LOG_COLUMNS)}")
    s = steps.sort_values("start_s").reset_index(drop=True)
    start = s["start_s"].to_numpy(float)
    end = s["end_s"].to_numpy(float)
    nxt = np.append(start[1:], np.nan)
    busy = ((nxt - end) * 1e3 < busy_gap_ms) | (_outstanding(records, (end + nxt) / 2) > 0)
    mid = (start + end) / 2
    ctx_sum, live, dec_longest = _decoding_context(records, mid)
    dec = s["decode_tokens"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_ctx = np.where(live > 0, ctx_sum / np.maximum(live, 1), 0.0)
    pre = s["prefill_tokens"].to_numpy(float)
    if "decode_steps" in s.columns:  # a multi-step decode group is several steps in one row: not fitted
        busy &= (s["decode_steps"] <= 1).to_numpy()
    pairs, ctx_pairs, chunk_ctx = _prefill_pairs(pre, records)
    dec_ctx = dec * mean_ctx
    if logs_contexts(s):  # as the engine counted them: exact, where the reconstruction is an estimate
        within = pairs - ctx_pairs  # Σ n²/2 of the chunks, which the log does not hold
        logged = s["prefill_context_tokens"].to_numpy(float)
        # the longest context a chunk reads (max c), which the log does not hold either: the stream's where it
        # agrees with the logged Σ n·c, else that of one chunk holding the step's prefill tokens (c = Σ n·c / n)
        agree = np.isclose(ctx_pairs, logged, rtol=0.01, atol=0.5)
        with np.errstate(invalid="ignore", divide="ignore"):
            one_chunk = np.where(pre > 0, logged / np.maximum(pre, 1), 0.0)
        chunk_ctx = np.where(agree, chunk_ctx, one_chunk)
        ctx_pairs = logged
        pairs = within + ctx_pairs
        dec_ctx = s["decode_context_tokens"].to_numpy(float) - dec  # the simulator counts cached tokens only
    # a step waits for its longest walk over cached keys: with prefill, in its one ragged kernel, a chunk's or a
    # decode's beside it (Study 1's mixed steps pay for their longest decode's context at the chunks' rate);
    # decode-only, in the decode kernel, its longest sequence's
    dec_longest = np.where(dec > 0, dec_longest, 0.0)
    longest = np.where(pre > 0, np.maximum(chunk_ctx, dec_longest), dec_longest)
    pad = np.zeros(len(s))
    if step_buckets:
        b = np.asarray(sorted(step_buckets), dtype=float)
        tokens = pre + dec
        i = np.searchsorted(b, tokens, side="left")
        inside = (pre > 0) & (i < len(b))
        pad[inside] = b[i[inside]] - tokens[inside]
    out = pd.DataFrame(
        {
            "start_s": start,
            "cycle_ms": _cycle_ms(s, start, nxt),
            "prefill_tokens": pre,
            "prefill_pairs": pairs,
            "context_pairs": ctx_pairs,
            "longest_context": longest,
            "decode_tokens": dec,
            "decode_context": dec_ctx,
            "num_seqs": s["num_seqs"].to_numpy(float),
            "pad_tokens": pad,
        }
    )
    return out[busy & (out["cycle_ms"] > 0)].reset_index(drop=True)


def _cycle_ms(s: pd.DataFrame, start: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """What each step cost: the time from its start to the next step's, except where the engine overlapped it
    (async scheduling: ``overlapped``, the next step launched before this one's tokens were read). There the next
    start follows this step's *launch*, not its work, so the gap is the previous step's cost, one row late: in
    Study 1's runs at 94c0bf13c028 a 512-token prefill of Llama-3-8B's shape began its next step 1.1 ms after its
    own start and ran 17 ms on the device. An overlapped step's cost is its device time (``device_ms``, CUDA events
    from its first kernel to its sampled tokens), where the log holds it."""
    gap = (nxt - start) * 1e3
    if not {"overlapped", "device_ms"} <= set(s.columns):
        return gap
    device = s["device_ms"].to_numpy(float)
    use = s["overlapped"].fillna(False).to_numpy(bool) & np.isfinite(device) & (device > 0)
    return np.where(use, device, gap)


def logs_contexts(steps: pd.DataFrame) -> bool:
    """Whether a run's step log holds the engine's context counts: both columns, and a decode context on every
    step with decodes (a server that leaves them at their default 0 did not count them)."""
    if not {"prefill_context_tokens", "decode_context_tokens"} <= set(steps.columns):
        return False
    d = steps["decode_tokens"].to_numpy(float)
    c = steps["decode_context_tokens"].to_numpy(float)
    return bool((d > 0).any()) and bool(np.all(np.isfinite(c))) and bool(np.all(c[d > 0] >= d[d > 0]))


def _prefill_pairs(pre: np.ndarray, records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step: causal query–key pairs of its prefill tokens, those between new and cached tokens, and the
    most cached tokens one of its chunks reads (max c), taking the steps' prefill tokens from the prompts laid
    end to end in send order (see the module docstring)."""
    sent = records["sent_s"].to_numpy(float)
    lengths = records["prompt_tokens"].to_numpy(float)[
        np.argsort(np.where(np.isnan(sent), np.inf, sent), kind="stable")
    ]
    ends = np.cumsum(lengths)
    pairs, ctx, chunk_ctx = np.zeros(len(pre)), np.zeros(len(pre)), np.zeros(len(pre))
    pos, j = 0.0, 0
    for i, p in enumerate(pre):
        left = float(p)
        while left > 0 and j < len(lengths):
            c = pos - (ends[j] - lengths[j])  # tokens of prompt j already prefilled
            take = min(left, ends[j] - pos)
            pairs[i] += take * (c + take / 2)
            ctx[i] += take * c
            chunk_ctx[i] = max(chunk_ctx[i], c)
            pos += take
            left -= take
            if pos >= ends[j]:
                j += 1
        if left > 0:  # a recompute the stream does not hold: context 0
            pairs[i] += left * left / 2
    return pairs, ctx, chunk_ctx


def _outstanding(records: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """Requests sent and not yet finished (or never finished) at each time in ``t``."""
    sent = records["sent_s"].to_numpy(float)
    sent = np.sort(np.where(np.isnan(sent), np.inf, sent))
    fin = records["finish_s"].to_numpy(float)
    fin = np.sort(np.where(np.isnan(fin), np.inf, fin))
    t = np.nan_to_num(t, nan=-np.inf)
    return np.searchsorted(sent, t, side="right") - np.searchsorted(fin, t, side="right")


def _decoding_context(records: pd.DataFrame, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """At each time in ``t``: the summed context (prompt + tokens received) of requests between their first
    and last token, how many there were, and the longest of those contexts."""
    r = check_records(records)
    ctx = np.zeros(len(t))
    live = np.zeros(len(t))
    longest = np.zeros(len(t))
    order = np.argsort(t)
    ts = t[order]
    for prompt, times in zip(r["prompt_tokens"], r["token_times_s"], strict=True):
        if len(times) < 2:
            continue
        times = np.asarray(times)
        lo, hi = np.searchsorted(ts, [times[0], times[-1]], side="left")
        if hi <= lo:
            continue
        got = np.searchsorted(times, ts[lo:hi], side="right")  # tokens received by then
        c = prompt + got - 1  # the newest token is the one being decoded
        ctx[order[lo:hi]] += c
        live[order[lo:hi]] += 1
        longest[order[lo:hi]] = np.maximum(longest[order[lo:hi]], c)
    return ctx, live, longest


def _col(f: pd.DataFrame, name: str) -> np.ndarray:
    return f[name].to_numpy(float) if name in f else np.zeros(len(f))


def _parts(base: StepCostModel, f: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Study 2's prefill intercept, the rest of its prefill part (padding and the context its chunks read
    included), and its decode part (ms, unscaled) of each step of ``f``."""
    a_p, b_p, k_p, k_cx, a_d, b_d, k_d = base.gpu_terms()
    pre = f["prefill_tokens"].to_numpy(float)
    has = pre > 0
    ctx = _col(f, "context_pairs")
    longest = _col(f, "longest_context")
    p_fixed = np.where(has, a_p, 0.0)
    p_var = np.where(
        has,
        b_p * (pre + _col(f, "pad_tokens"))
        + k_p * f["prefill_pairs"].to_numpy(float)
        + k_cx * ctx
        + base.ms_per_longest_context_token * longest,
        0.0,
    )
    d_part = (
        np.where(has, 0.0, a_d + base.ms_per_decode_walk_token * longest)
        + b_d * f["decode_tokens"].to_numpy(float)
        + k_d * f["decode_context"].to_numpy(float)
    )
    return p_fixed, p_var, d_part


def fit_overheads(base: StepCostModel, features: pd.DataFrame) -> tuple[StepCostModel, dict]:
    """``base`` with its serving terms (``prefill_scale``, ``prefill_fixed_scale``, ``ms_per_context_pair``,
    ``mixed_step_ms``, ``step_overhead_ms``, ``seq_overhead_ms``) fitted to the cycle times of ``features`` (from
    ``step_features``, possibly several runs). Returns the model and fit statistics (median and p90
    |relative error| of the cycle time with ``base`` as given and after, in %)."""
    if len(features) < 6:
        raise ParameterError(f"need at least 6 busy steps to fit the serving terms, got {len(features)}")
    y = features["cycle_ms"].to_numpy(float)
    p_fixed, p_var, d_part = _parts(base, features)
    ctx = features["context_pairs"].to_numpy(float) if "context_pairs" in features else np.zeros(len(y))
    n = features["num_seqs"].to_numpy(float)
    mixed = ((features["prefill_tokens"] > 0) & (features["decode_tokens"] > 0)).to_numpy(float)

    dec = features["prefill_tokens"].to_numpy(float) == 0
    if dec.sum() < 3 or (~dec).sum() < 3:
        raise ParameterError(
            f"need at least 3 decode-only and 3 prefill steps, got {int(dec.sum())} and {int((~dec).sum())}"
        )
    # The decode scale stays as given, unless the server decodes faster than ``base`` says (its decode-only steps
    # below the prediction at the median): no overhead can be negative, so the fit used to leave such a model as it
    # was (Study 1 at 94c0bf13c028: Qwen2-0.5B's decode steps took 1.27 ms against 2.41 ms in Study 2's engine mode,
    # and every step's prediction was 88% off). Then the scale takes that median ratio, and the overheads fit what
    # is left.
    sd = base.decode_scale
    ratio = float(np.median(y[dec] / np.maximum(sd * d_part[dec], 1e-9)))
    if ratio < 1:
        sd *= ratio
    d_part = sd * d_part
    # Two stages, so that the many decode steps do not drown the few prefill ones: the overheads from the
    # decode-only steps, then the prefill terms from what the prefill steps leave.
    # Robust (soft-L1) least squares on relative residuals: steps slowed by a GC pause, a compilation or a
    # busy CPU must not pull the fit; every term >= 0. Beyond the cut above, the decode scale stays as it is: on
    # decode-only steps it is indistinguishable from the overheads (a_d against the per-step one, b_d against the
    # per-sequence one).
    yd, nd = y[dec], n[dec]
    sol = least_squares(
        lambda c: (d_part[dec] + c[0] + c[1] * nd - yd) / yd,
        x0=[max(float(np.median(yd - d_part[dec])), 0.0), 0.0],
        bounds=([0, 0], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.05,
        x_scale="jac",
    )
    c0, c1 = (float(v) for v in sol.x)
    pre = ~dec
    yp = y[pre]
    rest = d_part[pre] + c0 + c1 * n[pre]
    # The prefill intercept scales on its own only when both prefill-only and mixed steps were seen (otherwise it
    # and the mixed-step cost are one number), and the mixed-step cost is fitted only when mixed steps were.
    n_mixed = int(mixed[pre].sum())
    free_fixed = n_mixed >= 3 and int(pre.sum()) - n_mixed >= 3 and float(p_fixed[pre].max()) > 0
    free_mixed = n_mixed >= 3
    pf, pv, cx, mx = p_fixed[pre], p_var[pre], ctx[pre], mixed[pre]

    def prefill_model(c):  # c = [prefill_scale, ms_per_context_pair, prefill_fixed_scale, mixed_step_ms]
        return c[0] * (c[2] * pf + pv) + c[1] * cx + c[3] * mx + rest

    lo = [0.1, 0.0, 0.0 if free_fixed else 1.0, 0.0]
    hi = [20.0, np.inf, 20.0 if free_fixed else 1.0 + 1e-9, np.inf if free_mixed else 1e-12]
    sol = least_squares(
        lambda c: (prefill_model(c) - yp) / yp,
        x0=[1.0, 0.0, 1.0, 0.0],
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.2,
        x_scale="jac",
    )
    sp, kc, fs, mstep = (float(v) for v in sol.x)
    fs = fs if free_fixed else 1.0
    mstep = mstep if free_mixed else 0.0

    model = base.with_overheads(
        prefill_scale=sp,
        decode_scale=sd,
        ms_per_context_pair=kc,
        step_overhead_ms=c0,
        seq_overhead_ms=c1,
        prefill_fixed_scale=fs,
        mixed_step_ms=mstep,
        source=f"{base.source} + serving terms fitted on {len(features)} steps",
    )
    before = 100 * np.abs(predict_cycles(base, features) - y) / y
    after = 100 * np.abs(predict_cycles(model, features) - y) / y
    stats = {
        "steps": int(len(features)),
        "prefill_scale": sp,
        "decode_scale": sd,
        "ms_per_context_pair": kc,
        "prefill_fixed_scale": fs,
        "mixed_step_ms": mstep,
        "median_abs_pct_before": float(np.median(before)),
        "p90_abs_pct_before": float(np.percentile(before, 90)),
        "median_abs_pct_after": float(np.median(after)),
        "p90_abs_pct_after": float(np.percentile(after, 90)),
    }
    return model, stats


def predict_cycles(model: StepCostModel, features: pd.DataFrame) -> np.ndarray:
    """``model``'s step time (ms) of each row of ``features``, its padding as the features give it."""
    cols = [
        features[k].to_numpy(float)
        for k in ("prefill_tokens", "prefill_pairs", "decode_tokens", "decode_context", "num_seqs")
    ]
    m = model.with_step_buckets(())
    b_p = m.prefill_scale * m.gpu_terms()[1]
    return np.array(
        [
            m.step_ms(p, q, d, c, n, x, k) + (b_p * pad if p else 0.0)
            for p, q, d, c, n, x, k, pad in zip(
                *cols,
                _col(features, "context_pairs"),
                _col(features, "longest_context"),
                _col(features, "pad_tokens"),
                strict=True,
            )
        ]
    )


def fit_step_log_model(features: pd.DataFrame, model: str, *, context_reads: bool = True) -> tuple[StepCostModel, dict]:
    """The whole ``CostModel`` form (prefill and decode terms) fitted to the cycle times of ``features``;
    serving overheads are inside its intercepts and per-sequence terms, and a step mixing prefill chunks with
    decodes pays a fixed cost of its own (``mixed_step_ms``) when the log holds both kinds of prefill step. For
    a model Study 2 did not measure. Each step's longest walk over cached keys is priced too (a chunk's or a
    decode's beside it in a step with prefill, the longest sequence's in a decode-only step; ``StepCostModel``)
    unless ``context_reads=False``.

    Like ``fit_overheads``: relative residuals, every term >= 0, a robust (soft-L1) loss, and two stages so that
    the many decode steps do not drown the few prefill ones. Least squares proper let a handful of outliers (a
    prefill step that ran into a slow HTTP hand-off, a recompute the reconstruction misplaces) pull the terms,
    and without the mixed-step cost a chunked server's mixed steps were priced like prefill-only ones."""
    pre = features[features["prefill_tokens"] > 0]
    dec = features[features["prefill_tokens"] == 0]
    if len(pre) < len(PREFILL_TERMS) or len(dec) < len(DECODE_TERMS) + 1:
        raise ParameterError(f"too few busy steps to fit {model}: {len(pre)} with prefill, {len(dec)} decode-only")
    # and a decode-only step waits for its longest sequence's walk over its keys (``StepCostModel``)
    walk = _col(dec, "longest_context") if context_reads else None  # None: unpriced (``ablation``'s before)
    Xd = np.column_stack(
        [np.ones(len(dec)), dec["decode_tokens"], dec["decode_context"]] + ([walk] if context_reads else [])
    )
    yd = dec["cycle_ms"].to_numpy(float)
    start, _ = nnls(Xd / yd[:, None], np.ones(len(yd)))
    cd = least_squares(
        lambda c: (Xd @ c - yd) / yd, x0=start, bounds=(0, np.inf), loss="soft_l1", f_scale=0.05, x_scale="jac"
    ).x
    w_d = float(cd[3]) if context_reads else 0.0
    # a mixed step: prefill terms + the decode terms of its decodes (not the decode intercept) + the mixed cost
    yp = pre["cycle_ms"].to_numpy(float)
    rest = (cd[1] * pre["decode_tokens"] + cd[2] * pre["decode_context"]).to_numpy(float)
    mixed = (pre["decode_tokens"] > 0).to_numpy(float)
    free_mixed = 3 <= mixed.sum() <= len(mixed) - 3  # else the mixed cost and the intercept are one number
    # padding tokens go through the dense layers like real ones: they count as prefill tokens
    # and a chunk after cached context pays for the context it reads (``servelab.studies.s08_simulator.context_reads``)
    Xp = np.column_stack(
        [
            np.ones(len(pre)),
            pre["prefill_tokens"] + _col(pre, "pad_tokens"),
            pre["prefill_pairs"],
            mixed,
            _col(pre, "longest_context") if context_reads else np.zeros(len(pre)),
        ]
    )
    hi = [np.inf, np.inf, np.inf, np.inf if free_mixed else 1e-12, np.inf if context_reads else 1e-12]
    cp = least_squares(
        lambda c: (Xp @ c + rest - yp) / yp,
        x0=[1.0, 0.01, 0.0, 0.0, 0.0],
        bounds=([0, 0, 0, 0, 0], hi),
        loss="soft_l1",
        f_scale=0.2,
        x_scale="jac",
    ).x
    mixed_ms = float(cp[3]) if free_mixed else 0.0
    cp[4] = cp[4] if context_reads else 0.0
    ep = 100 * (Xp[:, :3] @ cp[:3] + mixed_ms * mixed + cp[4] * Xp[:, 4] + rest - yp) / yp
    ed = 100 * (Xd @ cd - yd) / yd
    err = {
        "prefill_median_abs_pct": float(np.median(np.abs(ep))),
        "prefill_max_abs_pct": float(np.max(np.abs(ep))),
        "decode_median_abs_pct": float(np.median(np.abs(ed))),
        "decode_max_abs_pct": float(np.max(np.abs(ed))),
    }
    gpu = CostModel(
        model,
        "step_log",
        dict(zip(PREFILL_TERMS, map(float, cp[:3]), strict=True)),
        dict(zip(DECODE_TERMS, map(float, cd[:3]), strict=True)),
        err,
    )
    return StepCostModel(
        gpu=gpu,
        mixed_step_ms=mixed_ms,
        ms_per_longest_context_token=float(cp[4]),
        ms_per_decode_walk_token=w_d,
        source=f"{model}: fitted to {len(features)} busy steps of the server's step log",
    ), {
        "steps": int(len(features)),
        "mixed_step_ms": mixed_ms,
        "ms_per_longest_context_token": float(cp[4]),
        "ms_per_decode_walk_token": w_d,
        **err,
    }
