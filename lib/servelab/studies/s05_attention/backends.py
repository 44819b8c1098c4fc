"""SDPA's backends: forcing one, finding which one the default dispatch picks, and naming its kernel.

``F.scaled_dot_product_attention`` tries its backends in a priority order (on sm90 with torch 2.11:
cuDNN attention first) and runs the first whose constraints the inputs meet. The dispatcher does not
say which one ran, so ``picked_backend`` replays the choice: it forces each backend in priority order
and returns the first that accepts the inputs. ``kernel_names`` confirms it from the profiler.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

from servelab.measure.device import settle_sdpa

# our names → torch.nn.attention.SDPBackend members
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
# priority-order names as servelab.measure.device.sdpa_priority_order() spells them
_ORDER_NAMES = {
    "flash_attention": "flash",
    "efficient_attention": "efficient",
    "cudnn_attention": "cudnn",
    "math": "math",
}


def sdpa_backend(name: str):
    """The ``SDPBackend`` member for one of flash / efficient / cudnn / math."""
    from torch.nn.attention import SDPBackend

    if name not in BACKENDS:
        raise ValueError(f"SDPA backend must be one of {tuple(BACKENDS)}, got {name!r}")
    return getattr(SDPBackend, BACKENDS[name])


def priority_order(device=None) -> list[str]:
    """The backends SDPA tries, in order, in our names (backends torch does not name here are dropped).

    On sm90 torch moves cuDNN to the front of the global order at the first SDPA call on the GPU (the
    H200 run of 2026-12-02 showed flash first before any call and cuDNN first after), so the order is
    read after one small call on ``device`` (default: CUDA when present).
    """
    import torch

    from servelab.measure.device import sdpa_priority_order

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    _settle(device.type, device.index)
    return [_ORDER_NAMES[n] for n in sdpa_priority_order() if n in _ORDER_NAMES]


@functools.cache
def _settle(kind: str, index) -> None:
    """One tiny SDPA call on the device, so any lazy reordering of the backends has happened."""
    if kind == "cuda":
        settle_sdpa(f"{kind}:{index}" if index is not None else kind)


# kernel-name fragments → backend: how the profiler tells which backend really ran
_KERNEL_MARKS = (
    ("cudnn", "cudnn"),
    ("flash_fwd", "flash"),
    ("fmha", "efficient"),
    ("cutlassf", "efficient"),
    ("mem_eff", "efficient"),
)


def backend_from_kernels(names: str) -> str:
    """The SDPA backend that kernel names (from ``kernel_names``) belong to; 'math' when no fused
    attention kernel appears (the unfused path is matmuls and a softmax)."""
    low = names.lower()
    for mark, backend in _KERNEL_MARKS:
        if mark in low:
            return backend
    return "math" if low else ""


@contextlib.contextmanager
def forced(name: str | None):
    """Run SDPA with only backend ``name`` allowed (no-op for None: the default dispatch)."""
    if name is None:
        yield
        return
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([sdpa_backend(name)]):
        yield


def picked_backend(call) -> str:
    """Which backend the default dispatch runs for ``call()`` (a zero-argument SDPA call).

    Tries each backend alone, in priority order; the first that runs is the one the dispatcher would
    pick. 'none' if no backend accepts the inputs.
    """
    import torch

    for name in priority_order():
        try:
            with forced(name), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a refusing backend warns why; the refusal is the answer
                call()
            return name
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            continue
    return "none"


def kernel_names(call, top: int = 3) -> str:
    """The largest device kernels of one ``call()`` by GPU time, '; '-joined (CUDA only)."""
    from servelab.measure.kernel_profile import profile_call

    prof = profile_call(call, calls=2, warmup=1, top=top)
    return "; ".join(name for name, _, _ in prof.top_kernels)


def dispatch_table(shapes, dtype, device):
    """For each (label, AttentionShape): the backend SDPA's default picks by replay (``picked``), and on CUDA
    the kernels the profiler saw and the backend they belong to (``ran``); ``agree`` cross-checks the two.
    Returns a ``pandas.DataFrame``, one row per shape."""
    import pandas as pd
    import torch
    import torch.nn.functional as F

    rows = []
    for label, s in shapes:
        q, k, v = s.random_inputs(dtype, device)
        causal = s.mask.kind == "causal"
        call = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal, enable_gqa=s.arch.group > 1)
        row = dict(shape=label, **s.describe(), priority=" > ".join(priority_order(device)))
        try:
            row["picked"] = picked_backend(call)
            row["kernels"] = kernel_names(call) if torch.device(device).type == "cuda" else ""
            row["ran"] = backend_from_kernels(row["kernels"]) or row["picked"]
        except RuntimeError as e:  # an OOM or a refusal is a result here, not a crash
            row["picked"], row["kernels"], row["ran"] = "error", str(e).splitlines()[0][:160], ""
        row["agree"] = row["picked"] == row["ran"]
        rows.append(row)
        del q, k, v, call  # the call holds the inputs too
    return pd.DataFrame(rows)
