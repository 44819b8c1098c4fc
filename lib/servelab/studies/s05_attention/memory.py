"""Peak memory of one call, defined the same way for every variant.

``peak_bytes(call)`` is the most memory the call had allocated at once *beyond what was allocated
before it*: its intermediates, workspace and output, not its inputs (add the inputs' bytes to get the
"including inputs" figure; the sweeps record both).

- CUDA: ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated`` minus the bytes allocated
  before the call (the caching allocator sees every tensor and kernel workspace).
- CPU: there is no allocator counter, so ``LiveTensorBytes`` counts the storages that ATen ops return
  while the call runs (a dispatch mode), freeing them when their last tensor dies. It sees every
  intermediate tensor but not scratch a fused kernel allocates inside itself: good enough to show
  quadratic against linear growth in CI, not a substitute for the GPU number.
"""

from __future__ import annotations

import weakref

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter


class LiveTensorBytes(TorchDispatchMode):
    """Track the bytes of tensor storages created inside the mode: ``live`` now, ``peak`` at most."""

    def __init__(self):
        super().__init__()
        self._refs: dict[int, int] = {}  # storage address → live tensors viewing it
        self._bytes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live -= self._bytes.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch

        out = func(*args, **(kwargs or {}))
        for t in tree_iter(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self._refs:  # a new storage (views of an existing one share its address)
                    self._refs[key] = 0
                    self._bytes[key] = storage.nbytes()
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                self._refs[key] += 1
                weakref.finalize(t, self._release, key)
        return out


def method(device) -> str:
    """How ``peak_bytes`` measures on ``device``, in words (for notes and captions)."""
    import torch

    if torch.device(device).type == "cuda":
        return "max_memory_allocated during one call"
    return "bytes of live tensors during one call (CPU tensor tracker)"


def peak_bytes(call, device) -> int:
    """Peak bytes allocated by ``call()`` beyond those allocated before it (output included)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del out
        return int(peak)
    tracker = LiveTensorBytes()
    with tracker:
        out = call()
    del out
    return int(tracker.peak)
