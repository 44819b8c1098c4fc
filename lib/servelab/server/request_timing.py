"""Per-request times, taken in the engine thread: when a request was first scheduled, got its first token
and its last, as vLLM's metrics define them (queue, prefill, decode, inference, end-to-end, TPOT).

Times are ``time.perf_counter`` seconds from the request's ``arrival_s`` (stamped where the HTTP request
was received: the same clock in every process of a machine). A ``RequestRecorder`` (``ServerMetrics``, or
``Observations`` in an engine process) receives them.
"""

from __future__ import annotations

from typing import Protocol

from servelab.engine.sequence import SequenceStatus


class RequestRecorder(Protocol):
    def request_scheduled(self, queue_s: float) -> None: ...
    def request_tokens(self, ttft_s: float | None, itl_s: list[float], prompt_tokens: int, n: int) -> None: ...
    def request_finished(self, times: dict) -> None: ...
    def engine_steps(self, n: int) -> None: ...


class RequestTimer:
    """Tracks the admitted requests of one ``EngineLoop`` until they are scheduled, and reports the times
    of each to ``recorder``. Handles carry the stamps (``scheduled_s``, ``first_token_s``, ``last_token_s``)."""

    def __init__(self, recorder: RequestRecorder):
        self.recorder = recorder
        self._queued: dict = {}  # seq_id -> Handle, in admission order, until first scheduled

    def admitted(self, h) -> None:
        self._queued[h.seq.seq_id] = h

    def forget(self, h) -> None:
        if h.seq is not None:
            self._queued.pop(h.seq.seq_id, None)

    def after_step(self, step_start_s: float) -> None:
        """Stamp the requests this step scheduled for the first time with the step's start. Every policy
        here schedules its queue in order, so the scan stops at the first request still waiting: a round
        costs the newly scheduled plus one, whatever the queue's length."""
        done = []
        for seq_id, h in self._queued.items():
            if h.seq.status is SequenceStatus.WAITING and h.seq.num_computed_tokens == 0:
                break
            done.append(seq_id)
            h.scheduled_s = step_start_s
            self.recorder.request_scheduled(step_start_s - h.arrival_s)
        for seq_id in done:
            del self._queued[seq_id]

    def tokens(self, h, n: int, now: float) -> None:
        """``n`` tokens of ``h`` arrived at ``now`` (several at once from a multi-step decode group: the
        gaps between those count as 0)."""
        if h.first_token_s is None:
            h.first_token_s = now
            ttft, gaps = now - h.arrival_s, [0.0] * (n - 1)
        else:
            ttft, gaps = None, [now - h.last_token_s] + [0.0] * (n - 1)
        h.last_token_s = now
        h.num_generated += n
        self.recorder.request_tokens(ttft, gaps, len(h.prompt_ids), n)

    def finished(self, h, now: float) -> None:
        """``h`` ended (any reason) at ``now``; a request never admitted has no times to report."""
        self.forget(h)
        if h.seq is None:
            return
        sched, first, n = h.scheduled_s, h.first_token_s, h.num_generated
        self.recorder.request_finished(
            {
                "e2e": now - h.arrival_s,
                "inference": None if sched is None else now - sched,
                "prefill": None if sched is None or first is None else first - sched,
                "decode": None if first is None else h.last_token_s - first,
                "tpot": (h.last_token_s - first) / (n - 1) if first is not None and n > 1 else None,
                "prompt_tokens": len(h.prompt_ids),
                "generation_tokens": n,
            }
        )
