"""Which SDPA kernels Hugging Face ``generate`` runs on, and what a first call at a new length costs.

On the H200 with torch 2.11, SDPA's first choice is cuDNN attention. PyTorch keys its cuDNN plan cache on
the exact shapes, key length included, and builds (validates, plans, compiles) a new execution plan at
every miss. Decoding one token at a time grows the key length by one per step, so every step of an
eager ``generate`` at a length not seen before pays a plan build on the host; the plans for lengths
already seen are reused. That is a one-time cost per (shape, length) and process, not a property of
speculative decoding; it is the likely reason why eager decoding cost ~46 ms/token in the first H200
run of this study, where a run that followed one at the same lengths was several times faster.
``hf_sdpa="no_cudnn"`` runs the HF calls on flash / memory-efficient / math attention, the kernels the
seed's RTX 2070 had (cuDNN attention needs sm80+); :func:`first_call_costs` measures the cost that
avoids, so the page shows it rather than asserting it.
"""

from __future__ import annotations

import contextlib
import functools
import time

import pandas as pd

HF_SDPA_CHOICES = ("default", "no_cudnn")


@contextlib.contextmanager
def hf_sdpa(choice: str):
    """SDPA as torch dispatches it (``"default"``), or with cuDNN attention switched off (``"no_cudnn"``).

    The switch is process-wide (torch's global SDPA flags): wrap only the calls it is meant for."""
    if choice not in HF_SDPA_CHOICES:
        raise ValueError(f"hf_sdpa must be one of {HF_SDPA_CHOICES}, got {choice!r}")
    if choice == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def first_call_costs(
    heads: int,
    head_dim: int,
    key_lengths: list[int],
    backends: list[str],
    *,
    device: str,
    dtype=None,
    repeats: int = 5,
    seed: int = 0,
) -> pd.DataFrame:
    """Host wall time (ms) of a one-token decode SDPA call (query length 1, batch 1) at key lengths not seen
    before in this process, per backend: the first call at each length and the median of ``repeats`` more.

    Pick ``key_lengths`` that nothing else in the process uses, or the first call finds its plan cached.
    Times include a device synchronisation after the call: what a step of eager ``generate`` waits for.
    A backend that cannot run the shape gets rows with status "unsupported" and the error."""
    import numpy as np
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"unknown backends {sorted(unknown)}; known: {sorted(BACKENDS)}")
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    g = torch.Generator(device=device).manual_seed(seed)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t) * 1e3

    rows = []
    for name in backends:
        for n in key_lengths:
            q = torch.randn(1, heads, 1, head_dim, device=device, dtype=dtype, generator=g)
            k, v = (torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, generator=g) for _ in range(2))
            row = dict(backend=name, key_length=n, status="ok", error="", first_ms=np.nan, repeat_ms=np.nan)
            try:
                with sdpa_kernel([getattr(SDPBackend, BACKENDS[name])]):
                    call = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v)
                    row["first_ms"] = timed(call)
                    row["repeat_ms"] = float(np.median([timed(call) for _ in range(repeats)]))
            except Exception as e:  # noqa: BLE001 - "No available kernel" where the backend does not serve the shape
                row.update(status="unsupported", error=str(e).splitlines()[0][:200])
            rows.append(row)
    return pd.DataFrame(rows)


def first_call_summary(costs: pd.DataFrame) -> str:
    """One sentence per backend from :func:`first_call_costs`: median first-call and repeat ms (markdown)."""
    parts = []
    for name, g in costs.groupby("backend", sort=False):
        ok = g[g["status"] == "ok"]
        if ok.empty:
            parts.append(f"**{name}**: cannot run this shape here ({g['error'].iloc[0]})")
            continue
        first, again = float(ok["first_ms"].median()), float(ok["repeat_ms"].median())
        parts.append(
            f"**{name}**: first call at a new key length {first:.2f} ms, again {again:.3f} ms "
            f"({first / max(again, 1e-9):.0f}×)"
        )
    return "; ".join(parts) + "." if parts else "Nothing was measured."
