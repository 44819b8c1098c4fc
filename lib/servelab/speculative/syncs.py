"""Counting the host's waits on the device: a speculative round should have exactly one (its acceptance readback).

On CUDA, PyTorch's sync debug mode reports every synchronising call (a blocking copy, ``.item()``, ``.tolist()``,
a ``nonzero``, a stream synchronize) as a warning; ``HostSyncs`` counts them. On a CPU nothing synchronises, so
the same block is checked by counting the calls that would: reading a tensor's values into Python.
"""

from __future__ import annotations

import warnings

import torch

# the Tensor methods that hand a tensor's values to Python: on a GPU, each waits for the device
_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__")


class HostSyncs:
    """``with HostSyncs(device) as s: ...``; then ``s.count`` (the synchronising calls made inside)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.count = 0
        self._saved: dict = {}

    def __enter__(self) -> HostSyncs:
        if self.cuda:
            self._warnings = warnings.catch_warnings(record=True)
            self._log = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            for name in _READS:
                self._saved[name] = getattr(torch.Tensor, name)
                setattr(torch.Tensor, name, self._counting(self._saved[name]))
        return self

    def _counting(self, method):
        def read(t, *a, **kw):
            self.count += 1
            return method(t, *a, **kw)

        return read

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in self._log)
            self._warnings.__exit__(*exc)
        else:
            for name, method in self._saved.items():
                setattr(torch.Tensor, name, method)
