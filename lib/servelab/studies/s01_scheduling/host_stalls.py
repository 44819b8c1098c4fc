"""One-off host stalls in the servers' step logs: steps the GPU spent waiting on the host, not on the policy's work.

A step's ``host_ms`` is the CPU's time to schedule it, build its inputs and launch it (``engine.StepRecord``). It is
about a millisecond for every step kind, so a step whose host time alone reaches ``HOST_STALL_MS``, and is many times
its setting's usual host time for that step kind, was held up by something that is not scheduling: a kernel compiled
on its first use, an allocation, a garbage collection. No policy causes that, yet the decodes in that step wait for it
like for a long prefill, and one such step sets a whole point's worst stall (on the H200, one 531 ms step set
qwen2-0.5b's ChunkedPrefill stall at a low rate in one repeat). The page lists every one, so that a verdict leaning
on one can be read for what it is.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.s01_scheduling.step_costs import step_kind
from servelab.studies.s01_scheduling.summary import KEYS

HOST_STALL_MS = 100.0  # a step's scheduling and launch take ~1 ms; 100 ms of it is no scheduling decision
TIMES_USUAL = 10.0  # and at least this many times the median host time of the setting's steps of its kind
GROUP = ("repeat", "part", *KEYS)  # one run of one load point


def host_stalls(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps of ``steps`` (every repeat's step logs) held up on the host: ``host_ms`` ≥ ``HOST_STALL_MS`` and ≥
    ``TIMES_USUAL`` × the median ``host_ms`` of the steps of the same kind in the same run of the same setting.
    Columns: the group's keys, ``kind``, ``step_ms``, ``host_ms``, ``usual_host_ms``, the step's tokens, and
    ``gc_ms`` (the collector's share of ``host_ms``) where the log has it."""
    need = {"host_ms", "start_s", "end_s", "prefill_tokens", "decode_tokens"}
    if steps.empty or not need <= set(steps.columns):
        return pd.DataFrame()
    keys = [k for k in GROUP if k in steps.columns]
    kinds = [step_kind(p, d) for p, d in zip(steps["prefill_tokens"], steps["decode_tokens"], strict=True)]
    s = steps.assign(kind=kinds)
    s["step_ms"] = (s["end_s"] - s["start_s"]) * 1e3
    s["usual_host_ms"] = s.groupby([*keys, "kind"], dropna=False)["host_ms"].transform("median")
    hit = s[(s["host_ms"] >= HOST_STALL_MS) & (s["host_ms"] >= TIMES_USUAL * s["usual_host_ms"])]
    cols = [*keys, "kind", "step_ms", "host_ms", "usual_host_ms", "prefill_tokens", "decode_tokens"]
    cols += ["gc_ms"] if "gc_ms" in s.columns else []  # step logs since the engine timed its collector
    return hit[cols].reset_index(drop=True)
