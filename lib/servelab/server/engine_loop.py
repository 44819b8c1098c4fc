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
from servelab.server.request_timing import RequestRecorder, RequestTimer
from servelab.server.step_log import StepLog

log = logging.getLogger("servelab.server")
HIT_RATE_PERIOD_S = 0.5  # how often the prefix-cache hit rate gauge is refreshed from engine.stats()


class QueueFull(Exception):
    """Admitting a request would leave more requests waiting, beyond the free running slots, than ``max_waiting``."""

    def __init__(self, waiting: int, adding: int, limit: int, free_slots: int = 0):
        self.waiting, self.adding, self.limit, self.free_slots = waiting, adding, limit, free_slots
        mine = f"; this request has {adding} prompts" if adding > 1 else ""
        super().__init__(
            f"{waiting} requests are waiting for {free_slots} free running slots (at most {limit} may wait "
            f"beyond them){mine}"
        )


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


class Accepted(NamedTuple):
    seq_id: int


class Rejected(NamedTuple):
    error: Exception  # ParameterError: the client's fault (400); anything else: ours (500)


class Tokens(NamedTuple):
    token_ids: list[int]  # tokens produced for the request in one step (usually one)
    finish_reason: FinishReason | None  # set on the last update of a request
    logprobs: list | None = None  # one TokenLogprob per token, when the request asked for logprobs
    prompt_logprobs: list | None = None  # on the first update of a request that asked for prompt logprobs


def check_room(waiting: int, adding: int, limit: int | None, free_slots: int = 0) -> None:
    """``QueueFull`` unless ``adding`` more requests beside the ``waiting`` ones leave at most ``limit`` (None: no
    limit) waiting beyond the ``free_slots`` running slots, which take the first of them at the next step.
    A request's prompts are admitted all or none, so a refused request leaves nothing behind."""
    if limit is not None and waiting + adding - max(free_slots, 0) > limit:
        raise QueueFull(waiting, adding, limit, free_slots)


def max_running(engine) -> int:
    """How many requests ``engine`` runs at once (its scheduler's ``max_num_seqs``; 1 for one without)."""
    return getattr(getattr(engine, "scheduler", None), "max_num_seqs", 1)


@dataclass(eq=False)
class Handle:
    """A submitted request, as the engine thread tracks it. Times are ``time.perf_counter`` seconds."""

    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[object], None]
    arrival_s: float = field(default_factory=time.perf_counter)
    seq: Sequence | None = None
    rid: int = -1  # the request's id across a process boundary (EngineProcess)
    accepted: bool = False
    cancelled: bool = False
    scheduled_s: float | None = None  # the start of the step that first scheduled it
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_generated: int = 0
    done: bool = False
    sent_prompt_logprobs: bool = False


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        *,
        max_waiting: int | None = None,
        metrics: ServerMetrics | None = None,
        step_log: StepLog | None = None,
        after_iteration: Callable[[], None] | None = None,
        recorder: RequestRecorder | None = None,
    ):
        """``metrics`` gets the gauges and, unless a ``recorder`` is given, the per-request times."""
        self.engine = engine
        self.vocab = engine.model.shape.vocab
        self.max_model_len = engine.max_model_len
        self.after_iteration = after_iteration  # called in the engine thread after each round (batching hand-offs)
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.step_log = step_log
        self.timer = RequestTimer(recorder) if recorder is not None else None
        self._cond = threading.Condition()
        self._inbox: deque[Handle] = deque()
        self._aborts: deque[Handle] = deque()
        self._calls: deque[tuple[Callable, Future]] = deque()
        self._live: dict[int, Handle] = {}
        self._waiting_in_engine = 0  # the scheduler's queue length after the last step
        self._running_in_engine = 0  # the scheduler's running sequences after the last step
        self.max_running = max_running(engine)
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
        metrics.kv_total.set(self.engine.kv_blocks()[1])
        if self.timer is None:
            self.timer = RequestTimer(metrics)

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

    @property
    def free_slots(self) -> int:
        """Running slots free after the last step: the first waiting requests take them at the next."""
        return max(0, self.max_running - self._running_in_engine)

    @property
    def num_open(self) -> int:
        """Requests submitted and not finished (a drain ends when this is 0)."""
        return len(self._inbox) + len(self._live)

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        deliver: Callable[[object], None],
        arrival_s: float | None = None,
    ) -> Handle:
        """Queue a request; raises ``Draining`` or ``QueueFull`` at once instead of queuing. ``arrival_s``
        (``time.perf_counter``): when the request arrived, if before now (in another process)."""
        return self.submit_all([(prompt_ids, params, deliver)], arrival_s)[0]

    def submit_all(
        self, requests: list[tuple[list[int], SamplingParams, Callable]], arrival_s: float | None = None
    ) -> list[Handle]:
        """Queue several requests (the prompts of one HTTP request) all or none: ``Draining`` or
        ``QueueFull`` leave nothing queued."""
        now = time.perf_counter() if arrival_s is None else arrival_s
        handles = [Handle(list(p), sp, deliver, arrival_s=now) for p, sp, deliver in requests]
        with self._cond:
            if self._draining:
                raise Draining("the server is shutting down")
            if not self.alive and self._thread is not None:
                raise Draining("the engine has stopped")
            check_room(self.num_waiting, len(handles), self.max_waiting, self.free_slots)
            self._inbox.extend(handles)
            self._cond.notify()
        return handles

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

    def stop_now(self) -> None:
        """Abort every request and stop the thread at once (a second Ctrl-C). Lock-free, like ``begin_drain``:
        the engine thread reads the flags when it wakes, and the notify below wakes it if it sleeps."""
        self._draining = self._stop_when_idle = self._abort_all = True
        threading.Thread(target=self._wake, daemon=True).start()  # a signal handler must not wait for the lock

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

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
        clean = not self._thread.is_alive() and not self._abort_all
        if self._thread.is_alive():
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
        try:
            while self._round():
                pass
        except BaseException as e:  # a bug in this loop: no request may wait for a thread that is gone
            log.exception("the engine thread failed")
            self.error = e
            self._fail_all(e)
            raise
        finally:
            self._update_gauges()
            if self.after_iteration is not None:
                self.after_iteration()
            if self.step_log is not None:
                self.step_log.flush()

    def _round(self) -> bool:
        """Admit, abort, run calls, step once; False when the loop should end."""
        new, aborts, calls, stop = self._take_work()
        for h in new:
            self._admit(h)
        for h in aborts:
            self._cancel(h)
        self._run_calls(calls)
        if stop and not self.engine.has_unfinished():
            return False
        if self.engine.has_unfinished():
            self._step()
        self._update_gauges()
        if self.after_iteration is not None:
            self.after_iteration()
        return True

    def _take_work(self) -> tuple[list[Handle], list[Handle], list, bool]:
        with self._cond:
            while self._idle() and not self._stop_when_idle and not self._abort_all:
                if self.step_log is not None:
                    self.step_log.flush()  # a load has drained: make the log readable now
                self._cond.wait()
            new, self._inbox = list(self._inbox), deque()
            aborts, self._aborts = list(self._aborts), deque()
            calls, self._calls = list(self._calls), deque()
            if self._abort_all:
                aborts += list(self._live.values()) + new
                new = []
            stop = (self._stop_when_idle and self._idle() and not new) or self._abort_all
        return new, aborts, calls, stop

    def _run_calls(self, calls) -> None:
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self))
                except BaseException as e:  # noqa: BLE001 - the caller gets it
                    fut.set_exception(e)

    def _admit(self, h: Handle) -> None:
        if h.cancelled:  # aborted before it was admitted: it ends here, as an abort
            self._cancel(h)
            return
        try:
            h.seq = self.engine.add_request(h.prompt_ids, h.params, arrival_s=h.arrival_s)
        except ParameterError as e:
            h.done = True
            self._send(h, Rejected(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug must reach the client as a 500, not kill the thread
            log.exception("add_request failed")
            h.done = True
            self._send(h, Rejected(e))
            return
        self._live[h.seq.seq_id] = h
        if self.timer is not None:
            self.timer.admitted(h)
        self._send(h, Accepted(h.seq.seq_id))

    def _cancel(self, h: Handle) -> None:
        if h.done:
            return
        if h.seq is not None:
            self.engine.abort(h.seq)
            self._live.pop(h.seq.seq_id, None)
        self._finish(h)
        if self._abort_all and not h.cancelled:  # stopped by the server, not by its client: that is an error
            self._send(h, Rejected(RuntimeError("the server stopped before the request finished")))
        else:
            self._send(h, Tokens([], FinishReason.ABORT))  # whoever still listens learns it ended

    def _finish(self, h: Handle) -> None:
        h.done = True
        if self.timer is not None:
            self.timer.finished(h, time.perf_counter())

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
            log.exception("engine step failed")
            self.error = e
            self._fail_all(e)
            return
        if self.timer is not None:
            self.timer.after_step(t0)
        now = time.perf_counter()
        per_request: dict[int, list] = {}
        for ev in events:
            per_request.setdefault(ev.seq_id, []).append(ev)
        for seq_id, evs in per_request.items():
            h = self._live.get(seq_id)
            if h is not None:  # else aborted meanwhile
                self._hand_out(h, evs, now)

    def _hand_out(self, h: Handle, evs: list, now: float) -> None:
        if self.timer is not None:
            self.timer.tokens(h, len(evs), now)
        else:
            h.last_token_s = now
        last = evs[-1]
        if last.finished:
            self._live.pop(h.seq.seq_id, None)
            self._finish(h)
        logprobs = [ev.logprobs for ev in evs] if h.params.logprobs is not None else None
        prompt_logprobs = None
        if h.params.prompt_logprobs is not None and not h.sent_prompt_logprobs:
            h.sent_prompt_logprobs = True
            prompt_logprobs = list(h.seq.prompt_logprobs)
        reason = last.finish_reason if last.finished else None
        self._send(h, Tokens([ev.token_id for ev in evs], reason, logprobs, prompt_logprobs))

    def _fail_all(self, e: BaseException) -> None:
        """Every request admitted or queued ends with ``Rejected(e)``; the engine forgets them (so their KV
        blocks return) and serves on."""
        live, self._live = list(self._live.values()), {}
        for h in live:
            try:
                self.engine.abort(h.seq)
            except Exception:  # noqa: BLE001
                log.exception("abort after a failed step failed")
        with self._cond:
            queued, self._inbox = list(self._inbox), deque()
        error = e if isinstance(e, Exception) else RuntimeError(repr(e))
        for h in live + queued:
            if not h.done:
                self._finish(h)
                self._send(h, Rejected(error))

    def _send(self, h: Handle, update) -> None:
        try:
            h.deliver(update)
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is closed: nobody listens any more
            log.debug("deliver failed; aborting request", exc_info=True)
            if h.seq is not None and not h.done:
                self.engine.abort(h.seq)
                self._live.pop(h.seq.seq_id, None)
                self._finish(h)

    def _on_step(self, record) -> None:
        if self.step_log is not None:
            self.step_log(record)
        if self.timer is not None:
            self.timer.recorder.engine_steps(record.decode_steps)

    def gauges(self) -> dict:
        """The engine's state for the gauges (call from the engine thread): waiting (inbox and scheduler),
        queued (the scheduler's queue alone), running, kv_used and kv_total (blocks), preemptions (since the
        scheduler was made), and the prefix-cache hit rate (refreshed every ``HIT_RATE_PERIOD_S``; None
        without a cache)."""
        now = time.perf_counter()
        if now - self._last_hit_rate_s > HIT_RATE_PERIOD_S:
            self._last_hit_rate_s = now
            self._hit_rate = self.engine.stats().get("prefix_hit_rate")
        scheduler = self.engine.scheduler
        used, total = self.engine.kv_blocks()
        return {
            "waiting": self.num_waiting,
            "queued": len(scheduler.waiting),
            "running": len(scheduler.running),
            "kv_used": used,
            "kv_total": total,
            "preemptions": getattr(scheduler, "num_preemptions", 0),
            "hit_rate": self._hit_rate,
        }

    def _update_gauges(self) -> None:
        self._waiting_in_engine = len(self.engine.scheduler.waiting)
        self._running_in_engine = len(getattr(self.engine.scheduler, "running", ()))
        if self.metrics is not None:
            self.metrics.set_gauges(self.gauges())
