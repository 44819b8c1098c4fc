"""The one thread that owns the engine: it admits requests, steps, and hands tokens out.

The engine is not thread-safe, so every call into it (``add_request``, ``step``, ``abort``) happens
here. HTTP handlers talk to this thread through ``submit`` and ``abort``, which only touch a queue
under a lock; the thread drains that queue between steps. Each request carries a ``deliver``
callback that the thread calls with ``Accepted``, ``Rejected`` or ``Tokens`` updates; the app's
callback forwards them to the request's asyncio queue with ``loop.call_soon_threadsafe``.

When there is nothing to run the thread blocks on a condition variable (no busy polling).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

from servelab.engine import Engine, SamplingParams, Sequence
from servelab.engine.sequence import FinishReason
from servelab.errors import ParameterError
from servelab.server.metrics import ServerMetrics
from servelab.server.step_log import StepLog

log = logging.getLogger("servelab.server")
HIT_RATE_PERIOD_S = 0.5  # how often the prefix-cache hit rate gauge is refreshed from engine.stats()


class QueueFull(Exception):
    """More requests are waiting than ``max_waiting`` allows."""


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


class Accepted(NamedTuple):
    seq_id: int


class Rejected(NamedTuple):
    error: Exception  # ParameterError: the client's fault (400); anything else: ours (500)


class Tokens(NamedTuple):
    token_ids: list[int]  # tokens produced for the request in one step (usually one)
    finish_reason: FinishReason | None  # set on the last update of a request


@dataclass(eq=False)
class Handle:
    """A submitted request, as the engine thread tracks it."""

    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[object], None]
    arrival_s: float = field(default_factory=time.perf_counter)
    seq: Sequence | None = None
    rid: int = -1  # the request's id across a process boundary (EngineProcess)
    accepted: bool = False
    cancelled: bool = False
    last_token_s: float | None = None
    done: bool = False


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        *,
        max_waiting: int | None = None,
        metrics: ServerMetrics | None = None,
        step_log: StepLog | None = None,
        after_iteration: Callable[[], None] | None = None,
    ):
        self.engine = engine
        self.vocab = engine.model.shape.vocab
        self.max_model_len = engine.max_model_len
        self.after_iteration = after_iteration  # called in the engine thread after each round (batching hand-offs)
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.step_log = step_log
        self._cond = threading.Condition()
        self._inbox: deque[Handle] = deque()
        self._aborts: deque[Handle] = deque()
        self._calls: deque[tuple[Callable, Future]] = deque()
        self._live: dict[int, Handle] = {}
        self._waiting_in_engine = 0  # the scheduler's queue length after the last step
        self._draining = False
        self._stop_when_idle = False
        self._abort_all = False
        self._thread: threading.Thread | None = None
        self._last_hit_rate_s = 0.0
        self._hit_rate: float | None = None
        self.error: BaseException | None = None  # the last exception a step raised
        if metrics is not None:
            self.use_metrics(metrics)
        engine.on_step = self._on_step

    # ---- called from any thread -------------------------------------------------------------------
    def use_metrics(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        metrics.kv_total.set(self.engine.block_manager.num_blocks)

    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: submitted but not admitted, plus the scheduler's queue."""
        return len(self._inbox) + self._waiting_in_engine

    def submit(self, prompt_ids: list[int], params: SamplingParams, deliver: Callable[[object], None]) -> Handle:
        """Queue a request; raises ``Draining`` or ``QueueFull`` at once instead of queuing."""
        h = Handle(list(prompt_ids), params, deliver)
        with self._cond:
            if self._draining:
                raise Draining("the server is shutting down")
            if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
                raise QueueFull(f"{self.num_waiting} requests are waiting (limit {self.max_waiting})")
            self._inbox.append(h)
            self._cond.notify()
        return h

    def abort(self, handle: Handle) -> None:
        """Cancel a request (its client went away, or a stop string ended it); its KV blocks are freed."""
        with self._cond:
            handle.cancelled = True
            self._aborts.append(handle)
            self._cond.notify()

    def call(self, fn: Callable[[EngineLoop], object]) -> Future:
        """Run ``fn(self)`` in the engine thread between two steps (the only safe time to touch the engine
        from outside, e.g. to swap its scheduler while idle); a ``Future`` of its result."""
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def begin_drain(self) -> None:
        """Refuse new requests from now on; running ones continue. Lock-free: it runs in a signal handler."""
        self._draining = True

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Finish the running requests, then stop the thread. Requests still running after ``timeout_s``
        are aborted. Whether everything finished in time."""
        with self._cond:
            self._draining = True
            self._stop_when_idle = True
            self._cond.notify()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        clean = not self._thread.is_alive()
        if not clean:
            with self._cond:
                self._abort_all = True
                self._cond.notify()
            self._thread.join(10.0)
        if self.step_log is not None:
            self.step_log.close()
        return clean

    # ---- the engine thread ------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not (self._inbox or self._aborts or self._calls) and not self.engine.has_unfinished()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._idle() and not self._stop_when_idle and not self._abort_all:
                    if self.step_log is not None:
                        self.step_log.flush()  # a load has drained: make the log readable now
                    self._cond.wait()
                new, self._inbox = list(self._inbox), deque()
                aborts, self._aborts = list(self._aborts), deque()
                calls, self._calls = list(self._calls), deque()
                abort_all = self._abort_all
                if abort_all:
                    aborts += list(self._live.values()) + new
                    new = []
                stop = (self._stop_when_idle and self._idle() and not new) or abort_all
            for h in new:
                self._admit(h)
            for h in aborts:
                self._cancel(h)
            for fn, fut in calls:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self))
                    except BaseException as e:  # noqa: BLE001 - the caller gets it
                        fut.set_exception(e)
            if stop and not self.engine.has_unfinished():
                break
            if self.engine.has_unfinished():
                self._step()
            self._update_gauges()
            if self.after_iteration is not None:
                self.after_iteration()
        self._update_gauges()
        if self.after_iteration is not None:
            self.after_iteration()
        if self.step_log is not None:
            self.step_log.flush()

    def _admit(self, h: Handle) -> None:
        if h.cancelled:
            return
        try:
            h.seq = self.engine.add_request(h.prompt_ids, h.params, arrival_s=h.arrival_s)
        except ParameterError as e:
            self._send(h, Rejected(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug must reach the client as a 500, not kill the thread
            log.exception("add_request failed")
            self._send(h, Rejected(e))
            return
        self._live[h.seq.seq_id] = h
        self._send(h, Accepted(h.seq.seq_id))

    def _cancel(self, h: Handle) -> None:
        if h.done:
            return
        if h.seq is not None:
            self.engine.abort(h.seq)
            self._live.pop(h.seq.seq_id, None)
        h.done = True
        self._send(h, Tokens([], FinishReason.ABORT))  # whoever still listens learns it ended

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
            log.exception("engine step failed")
            self.error = e
            for h in list(self._live.values()):
                try:
                    self.engine.abort(h.seq)
                except Exception:  # noqa: BLE001
                    log.exception("abort after a failed step failed")
                h.done = True
                self._send(h, Rejected(e))
            self._live.clear()
            return
        now = time.perf_counter()
        per_request: dict[int, list] = {}
        for ev in events:
            per_request.setdefault(ev.seq_id, []).append(ev)
        m = self.metrics
        for seq_id, evs in per_request.items():
            h = self._live.get(seq_id)
            if h is None:  # aborted meanwhile
                continue
            if m is not None:
                if h.last_token_s is None:
                    m.ttft.observe(now - h.arrival_s)
                else:
                    m.itl.observe(now - h.last_token_s)
                for _ in evs[1:]:  # a multi-step decode group hands several tokens out at once
                    m.itl.observe(0.0)
                m.generated.inc(len(evs))
            h.last_token_s = now
            last = evs[-1]
            if last.finished:
                h.done = True
                self._live.pop(seq_id, None)
            self._send(h, Tokens([ev.token_id for ev in evs], last.finish_reason if last.finished else None))

    def _send(self, h: Handle, update) -> None:
        try:
            h.deliver(update)
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is closed: nobody listens any more
            log.debug("deliver failed; aborting request", exc_info=True)
            if h.seq is not None and not h.done:
                self.engine.abort(h.seq)
                h.done = True
                self._live.pop(h.seq.seq_id, None)

    def _on_step(self, record) -> None:
        if self.step_log is not None:
            self.step_log(record)
        if self.metrics is not None:
            self.metrics.steps.inc(record.decode_steps)

    def gauges(self) -> dict:
        """The engine's state for the gauges (call from the engine thread): waiting, running, kv_used, and
        the prefix-cache hit rate (refreshed every ``HIT_RATE_PERIOD_S``; None without a cache)."""
        now = time.perf_counter()
        if now - self._last_hit_rate_s > HIT_RATE_PERIOD_S:
            self._last_hit_rate_s = now
            self._hit_rate = self.engine.stats().get("prefix_hit_rate")
        return {
            "waiting": self.num_waiting,
            "running": len(self.engine.scheduler.running),
            "kv_used": self.engine.block_manager.num_used_blocks,
            "hit_rate": self._hit_rate,
        }

    def _update_gauges(self) -> None:
        self._waiting_in_engine = len(self.engine.scheduler.waiting)
        if self.metrics is not None:
            self.metrics.set_gauges(self.gauges())
