"""Where the time goes in one call: kernel count, GPU-busy fraction and CPU time per launch (torch.profiler)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class KernelProfile:
    wall_ms: float  # host wall time of the profiled calls, synchronised, per call
    kernels: int  # device kernels launched per call
    gpu_busy_ms: float  # sum of kernel durations per call
    gpu_busy_pct: float  # gpu_busy_ms / wall_ms
    cpu_us_per_launch: float  # wall time per kernel launched: the launch-bound cost of one kernel
    top_kernels: list  # [(name, count, total_us)] for the largest kernels

    def as_dict(self) -> dict:
        return asdict(self)


def profile_call(fn: Callable[[], object], *, calls: int = 3, warmup: int = 2, top: int = 8) -> KernelProfile:
    """Profile ``calls`` runs of ``fn`` on the GPU and summarise per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("profile_call needs a CUDA device: kernel counts have no meaning on the CPU")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    kernels, busy_us, by_name = 0, 0.0, {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith(("Memcpy", "Memset")):
            kernels += 1
            dur = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
            busy_us += dur
            n, tot = by_name.get(ev.name, (0, 0.0))
            by_name[ev.name] = (n + 1, tot + dur)
    kernels_per_call = kernels / calls
    busy_ms = busy_us / 1e3 / calls
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return KernelProfile(
        wall_ms=wall_ms,
        kernels=int(round(kernels_per_call)),
        gpu_busy_ms=busy_ms,
        gpu_busy_pct=100.0 * busy_ms / wall_ms if wall_ms else float("nan"),
        cpu_us_per_launch=wall_ms * 1e3 / kernels_per_call if kernels_per_call else float("nan"),
        top_kernels=[(name[:80], n // calls, tot / calls) for name, (n, tot) in ranked],
    )
