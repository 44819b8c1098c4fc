"""Programmatic dependent launch (PDL): a launch that may start while the one before it on the stream drains.

Why: in a batch-1 decode step every launch is short (a few µs), and each pays its start-up and its first reads
after the launch before it has finished. With PDL (Hopper and later) a kernel launched with ``launch_pdl=True`` may
start once every program of the one before has called ``gdc_launch_dependents`` (or exited); it reads what does not
depend on that launch (a linear layer's weights) and then calls ``gdc_wait``, which returns when the launch before
has finished and its writes are visible. A kernel must write nothing before its wait: a buffer it writes may be one
the launch before is still reading. CUDA graphs capture the dependency as a programmatic edge.

The kernels that take it (``small_linear``, ``triton_decode``) have a ``PDL`` constexpr and take ``pdl=`` per call.
``None`` means the calling context's choice: off, unless the call runs inside ``launches(True)``, which is what a
model ``bind`` switched does around every forward (the engine's ``EngineConfig.pdl``). A context variable and not a
module flag, so two engines in one process (a target and its draft, a bench's default and its ``pdl=False`` row)
each launch as their own setting says, and a CUDA graph keeps the launches its capture made.
"""

from __future__ import annotations

import contextvars
import functools
import os
import types
from contextlib import contextmanager

import torch

from servelab.errors import ParameterError

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("servelab_pdl", default=False)


def supported(device) -> bool:
    """Hopper (compute capability 9.0) or later, compiled (Triton's interpreter has no such launch)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    return _cuda_supported(device.index)


# asked at every launch that names no ``pdl`` (an eager step's hundred small launches): the answer is the device's and
# the process's (Triton's interpreter is chosen at start), so it is looked up once
@functools.cache
def _cuda_supported(index: int | None) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def wanted(device, pdl: bool | None) -> bool:
    """Whether a launch on ``device`` takes PDL: ``pdl`` as given (refused where the device has none), or the calling
    context's choice (``launches``) where the device has it."""
    if pdl is None:
        return _ON.get() and supported(device)
    if not isinstance(pdl, bool):
        raise ParameterError(f"pdl must be True or False, got {pdl!r}")
    if pdl and not supported(device):
        raise ParameterError(f"pdl needs a CUDA GPU of compute capability 9.0 or later, compiled, got {device}")
    return pdl


@contextmanager
def launches(on: bool):
    """Launches inside that name no ``pdl`` of their own take ``on``."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def bind(model, on: bool) -> None:
    """Every call of ``model`` (eager, or captured into a CUDA graph) launches inside ``launches(on)``; binding again
    replaces the setting rather than wrapping twice. Bound methods, not closures, so a deep copy of the model calls
    its own forward under its own setting."""
    if "_pdl_inner_forward" not in vars(model):
        model._pdl_inner_forward = model.forward
    model._pdl_on = bool(on)
    model.forward = types.MethodType(_bound_forward, model)


def _bound_forward(model, *args, **kwargs):
    with launches(model._pdl_on):
        return model._pdl_inner_forward(*args, **kwargs)


def launch_kw(pdl: bool) -> dict:
    """The launch option that asks for PDL (none without it, so older Triton builds see no new option)."""
    return {"launch_pdl": True} if pdl else {}
