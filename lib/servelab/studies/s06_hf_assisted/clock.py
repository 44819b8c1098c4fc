"""A streamer that timestamps each batch of new tokens as ``generate`` hands it out (and, through ``mark``, the
engine's steps, so that Study 6's HF and engine runs share one clock).

HF ``generate`` calls ``streamer.put`` first with the prompt, then with every batch of new tokens:
one token per step in plain decoding, the accepted tokens plus one in assisted decoding. Each ``put``
already follows a device synchronisation (the tokens were copied to the host), so a CUDA event
recorded there marks when the tokens existed on the device. One run of N tokens therefore gives the
time to reach every output length k ≤ N, and reading it at k = 32, 64, …, 512 costs one run instead
of one per length.
"""

from __future__ import annotations

import time

import numpy as np

try:  # transformers' base class: generate() only checks for put() and end(), but subclass it where it exists
    from transformers.generation.streamers import BaseStreamer
except ImportError:  # pragma: no cover
    BaseStreamer = object


class TokenClock(BaseStreamer):
    """Records (new tokens so far, ms since ``start()``) at every ``put`` after the prompt's.

    On CUDA the clock is a pair of CUDA events per mark, read after the run (``marks()``
    synchronises); on the CPU it is ``time.perf_counter``.
    """

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._start = None
        self._marks: list = []
        self._counts: list[int] = []
        self._prompt_seen = False
        self.ended = False

    def start(self) -> None:
        """Call right before ``generate``: the zero of the clock."""
        self._marks, self._counts, self._prompt_seen, self.ended = [], [], False, False
        self._start = self._now()

    def _now(self):
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def put(self, value) -> None:
        if self._start is None:
            raise RuntimeError("TokenClock.start() must be called before generate()")
        if not self._prompt_seen:  # generate streams the prompt first
            self._prompt_seen = True
            return
        self.mark(int(value.numel()))

    def mark(self, new_tokens: int) -> None:
        """A mark now: ``new_tokens`` more tokens exist (the engine's runs call it after each step, as ``put`` does
        for HF's, so both methods are timed on one clock)."""
        if self._start is None:
            raise RuntimeError("TokenClock.start() must be called before the first mark")
        self._counts.append(int(new_tokens))
        self._marks.append(self._now())

    def end(self) -> None:
        self.ended = True

    def marks(self) -> tuple[np.ndarray, np.ndarray]:
        """(cumulative new tokens, ms since start) at each put."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            ms = [self._start.elapsed_time(e) for e in self._marks]
        else:
            ms = [(t - self._start) * 1e3 for t in self._marks]
        return np.cumsum(self._counts, dtype=np.int64), np.asarray(ms, dtype=float)


def time_to_tokens(counts: np.ndarray, ms: np.ndarray, k: int) -> float:
    """ms until at least ``k`` new tokens existed (NaN if the run made fewer)."""
    idx = np.searchsorted(counts, k)  # first mark with count >= k
    return float(ms[idx]) if idx < len(ms) else float("nan")


def per_token_ms(counts: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """ms per token of each put after the first (the first carries the prefill)."""
    if len(ms) < 2:
        return np.array([], dtype=float)
    return np.diff(ms) / np.diff(counts)
