"""F4.4's mechanism probes: why compaction is faster or slower during decode.

- ``kernel_comparison``: each compaction kernel's GPU time alone and during decode (torch.profiler): longer during
  decode means contention for memory bandwidth or SMs; shorter means the GPU ran faster (clocks);
- ``clocks_by_condition``: SM/memory clocks and power sampled by ``nvidia-smi`` while each condition runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from servelab.studies.common.quiet import quiet_profiler
from servelab.studies.s04_kv_cache.overlap import CONDITIONS, OverlapRig


def kernel_comparison(rig: OverlapRig, calls: int = 5) -> pd.DataFrame:
    """Per-kernel GPU time (µs per call, torch.profiler) of the compaction's kernels alone and during decode.

    The compaction's kernels are those of ``compaction_alone``. During decode, a kernel of the same name may also
    belong to the decode (an embedding is an index_select too), so the decode's own share, measured in
    ``decode_alone``, is subtracted. A kernel that takes longer during decode competes for memory bandwidth or
    SMs; one that takes less ran at higher clocks.
    """
    from servelab.measure.kernel_profile import profile_call

    conds = [c for c in CONDITIONS if c in rig.conditions]
    with quiet_profiler():
        prof = {c: profile_call(lambda c=c: rig.run(c), calls=calls, warmup=1, top=200) for c in conds}
    per = {c: {name: (n, us) for name, n, us in p.top_kernels} for c, p in prof.items()}
    rows = []
    for name, (n, us) in per["compaction_alone"].items():
        n_d, us_d = per["decode_alone"].get(name, (0, 0.0))
        row = dict(kernel=name, launches_per_call=n, alone_us=us, shared_with_decode=n_d > 0)
        for cond, col in (("concurrent", "during_decode"), ("concurrent_prioritised", "during_prioritised_decode")):
            if cond in per:
                during = per[cond].get(name, (0, np.nan))[1] - us_d
                row.update({f"{col}_us": during, f"{col}_ratio": during / us if us else np.nan})
        rows.append(row)
    totals = pd.DataFrame(
        [
            dict(
                kernel=f"[all kernels, {c}]", launches_per_call=p.kernels, gpu_busy_ms=p.gpu_busy_ms, wall_ms=p.wall_ms
            )
            for c, p in prof.items()
        ]
    )
    return pd.concat([pd.DataFrame(rows), totals], ignore_index=True)


def clocks_by_condition(rig: OverlapRig, seconds: float = 1.0) -> pd.DataFrame:
    """SM and memory clocks and power while each condition runs back to back for ``seconds`` (CUDA only)."""
    return pd.DataFrame([dict(condition=c, **clocks_during(lambda c=c: rig.run(c), seconds)) for c in rig.conditions])


def clocks_during(fn: Callable[[], object], seconds: float = 1.0) -> dict:
    """SM/memory clocks (MHz) and power (W) sampled by ``nvidia-smi`` halfway through ``seconds`` of ``fn`` calls.

    Tests the 'clocks' explanation: does the GPU run faster clocks when both streams are busy?
    """
    import torch

    from servelab.measure.device import read_clocks

    sample = {}
    timer = threading.Timer(seconds / 2, lambda: sample.update(read_clocks()))
    t0 = time.perf_counter()
    timer.start()
    calls = 0
    while time.perf_counter() - t0 < seconds or timer.is_alive():
        fn()
        calls += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return dict(calls=calls, **sample)


def cold_start_effect(rig: OverlapRig, *, idle_s: float = 1.5, samples: int = 5, warm_runs: int = 20) -> pd.DataFrame:
    """Compaction time right after the GPU sat idle for ``idle_s`` seconds ("cold") vs back to back ("warm").

    An idle GPU drops its clocks; the first kernels after idling run before they ramp up again. A measurement of
    "compaction alone" taken first, from idle, and "compaction during decode" taken after, on a busy GPU, would
    credit the clocks to the overlap. The SM clock is sampled while idle (before each cold run) and after the
    warm runs (``nvidia-smi``; empty on machines without it).
    """
    from servelab.measure.device import read_clocks

    if idle_s < 0 or samples < 1 or warm_runs < samples:
        raise ValueError("need idle_s >= 0, samples >= 1 and warm_runs >= samples")
    rows = []
    for i in range(samples):
        time.sleep(idle_s)
        clocks = read_clocks()  # still idle: nvidia-smi runs on the host
        rows.append(
            dict(
                state="cold",
                sample=i,
                compaction_ms=rig.run("compaction_alone")["compaction_ms"],
                sm_clock_mhz=_mhz(clocks, "clocks.sm"),
            )
        )
    warm = [rig.run("compaction_alone")["compaction_ms"] for _ in range(warm_runs)]
    clocks = read_clocks()
    rows += [
        dict(state="warm", sample=i, compaction_ms=t, sm_clock_mhz=_mhz(clocks, "clocks.sm"))
        for i, t in enumerate(warm[-samples:])
    ]
    return pd.DataFrame(rows)


def _mhz(clocks: dict, key: str) -> float:
    try:
        return float(clocks[key])
    except (KeyError, ValueError):
        return np.nan
