"""Device time of each call of one method, measured where it is called, in place.

``CallTimer(owner, "name", device)`` wraps ``owner.name`` on the instance: every call records a pair of CUDA events
around it (wall time on a CPU), and nothing waits for the device until ``ms()`` reads them after the run, so the
timing never adds a host sync to what it times (a speculative round's draft phase, a verify step, an engine step).
``remove()`` puts the class's method back. ``note(*args, **kwargs)``, if given, is kept for each call beside its time
(``notes``): what the call was asked, e.g. how many draft steps a speculative round ran.
"""

from __future__ import annotations

import time

import torch


class CallTimer:
    def __init__(self, owner, name: str, device, note=None):
        self.owner, self.name = owner, name
        self.cuda = torch.device(device).type == "cuda"
        self.calls: list = []
        self.notes: list = []
        inner = getattr(owner, name)

        def timed(*a, **kw):
            if note is not None:
                self.notes.append(note(*a, **kw))
            if not self.cuda:
                t0 = time.perf_counter()
                out = inner(*a, **kw)
                self.calls.append((time.perf_counter() - t0) * 1e3)
                return out
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = inner(*a, **kw)
            end.record()
            self.calls.append((start, end))
            return out

        setattr(owner, name, timed)

    def ms(self) -> list[float]:
        """Each call's time so far (ms), in call order; waits for the device once."""
        if self.cuda:
            torch.cuda.synchronize()
        return [c if isinstance(c, float) else c[0].elapsed_time(c[1]) for c in self.calls]

    def reset(self) -> None:
        """Forget every call so far, read or not."""
        self.calls.clear()
        self.notes.clear()

    def remove(self) -> None:
        self.owner.__dict__.pop(self.name, None)
