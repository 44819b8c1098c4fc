"""Where to put the rate sweep: a rough capacity estimate from a short probe of the server.

Study 1 must sweep the request rate from light load to past saturation on engines whose speed it does not
know in advance (two model sizes, an engine under development). So before the sweep, each model serves a
burst of requests under EagerContBatch, whose steps are either pure prefill or pure decode, and the step
log gives two costs:

- ``prefill_s_per_token``: prefill step time / prefill tokens, summed over the prefill steps;
- ``decode_step_s``: the median decode iteration, from one decode step's start to the next step's start, so
  that the server's own work between steps (handing tokens to the HTTP streams) counts; the probe's batch is
  smaller than a full one, so this underestimates a full batch's iteration.

A request of P prompt and O output tokens, with ``B`` sequences decoding together, then costs about
``P · prefill_s_per_token + O · decode_step_s / B`` seconds of GPU time, and the server saturates near
``capacity ≈ 1 / E[that]`` requests per second. This is a first-order model to place the rates (which are
fractions of it); the measured throughput and the capacity at an SLO come from the sweep itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from servelab.studies.s01_scheduling.step_costs import step_kind


@dataclass(frozen=True)
class CapacityEstimate:
    prefill_s_per_token: float  # s per prefill token
    decode_step_s: float  # s per decode iteration, start to next start (median over the probe's decode steps)
    decode_batch: float  # median sequences per decode step in the probe
    batch: int  # sequences assumed to decode together at saturation (max_num_seqs)
    mean_prompt_tokens: float
    mean_output_tokens: float
    request_s: float  # estimated GPU seconds per request
    capacity_req_s: float  # 1 / request_s

    def as_dict(self) -> dict:
        return asdict(self)


def estimate_capacity(
    steps: pd.DataFrame, *, mean_prompt_tokens: float, mean_output_tokens: float, batch: int
) -> CapacityEstimate:
    """The estimate from a step log of whole-prompt prefill steps and pure decode steps (columns
    ``start_s, end_s, prefill_tokens, decode_tokens, num_seqs``). ``ValueError`` if it holds no prefill
    step or no decode step."""
    steps = steps.sort_values("start_s").reset_index(drop=True)
    dur = steps["end_s"] - steps["start_s"]
    kind = pd.Series(
        [step_kind(p, d) for p, d in zip(steps["prefill_tokens"], steps["decode_tokens"], strict=True)],
        index=steps.index,
    )
    pre = kind == "prefill only"
    dec = (kind == "decode only") & (steps["decode_tokens"] > 0)  # an empty step (nothing scheduled) costs nothing
    if not pre.any() or not dec.any():
        raise ValueError(
            f"the probe needs prefill-only and decode-only steps; got {int(pre.sum())} and {int(dec.sum())}"
        )
    p = float(dur[pre].sum() / steps.loc[pre, "prefill_tokens"].sum())
    iteration = steps["start_s"].shift(-1) - steps["start_s"]  # to the next step's start; NaN for the last
    d_iter = iteration[dec].dropna()
    d = float(np.median(d_iter)) if len(d_iter) else float(np.median(dur[dec]))
    request_s = p * mean_prompt_tokens + mean_output_tokens * d / batch
    return CapacityEstimate(
        p,
        d,
        float(np.median(steps.loc[dec, "num_seqs"])),
        int(batch),
        float(mean_prompt_tokens),
        float(mean_output_tokens),
        request_s,
        1.0 / request_s,
    )


def probe_roofline(est: CapacityEstimate, shape, roofline, dtype_bytes: int) -> dict:
    """The probe's two costs against the roofline floors of the same run's measured ceilings: a decode
    step of ``decode_batch`` sequences at the mean prompt's context, and a prefill of the mean prompt
    (per token). ``*_pct_of_floor``: floor time / measured time, 100% = at the roofline."""
    ctx, b = int(round(est.mean_prompt_tokens)), max(1, int(round(est.decode_batch)))
    dec_ms = est.decode_step_s * 1e3
    dflops, dbytes = shape.decode_flops(b, ctx), shape.decode_bytes(b, ctx, dtype_bytes)
    pre_ms = est.prefill_s_per_token * ctx * 1e3
    pflops, pbytes = shape.prefill_flops(ctx), shape.prefill_bytes(ctx, dtype_bytes=dtype_bytes)
    return {
        "decode_floor_ms": float(roofline.floor_ms(dflops, dbytes)),
        "decode_pct_of_floor": float(roofline.pct_of_floor(dec_ms, dflops, dbytes)),
        "decode_bound": str(roofline.bound(dflops, dbytes)),
        "prefill_floor_us_per_token": float(roofline.floor_ms(pflops, pbytes)) * 1e3 / ctx,
        "prefill_pct_of_floor": float(roofline.pct_of_floor(pre_ms, pflops, pbytes)),
        "prefill_bound": str(roofline.bound(pflops, pbytes)),
    }
