"""The engine in a process of its own, so that HTTP work never competes with it for the GIL.

One Python process serving HTTP and stepping the engine runs both on one GIL: formatting and sending
tens of thousands of SSE chunks a second would stretch the engine's steps, and Study 1 would measure
Python contention instead of scheduling (vLLM's V1 splits its API server from its engine core for the
same reason). ``python -m servelab.server`` therefore forks an engine process before it loads anything
on the GPU: the child builds the engine and runs an ``EngineLoop``; the parent serves HTTP. From any other
process (a notebook that has used torch already) the child is spawned instead.

They talk over one ``multiprocessing.Pipe``: the parent sends ``("add", rid, prompt_ids, params, arrival_s)``,
``("abort", rid)``, ``("call", cid, fn, args)`` and ``("drain", timeout_s)``; the child sends ``("ready", info)``
once, then one ``("updates", [(rid, update), ...], gauges, observations)`` message per engine round (not one
per token), ``("result", cid, ok, value)`` per call, and ``("drained", clean)`` at the end. ``EngineProcess``
is the parent's proxy and offers the same interface as ``EngineLoop`` (``submit_all``, ``abort``,
``begin_drain``, ``drain``, ``stop_now``, ...), so the app uses either.

Per-request times are measured in the child from the parent's arrival stamp (``time.perf_counter`` is one
clock for the machine) and recorded in the parent's metrics (``metrics.Observations``); the step log is
written by the child.

Supervision (``supervision.py``): the child dies with the parent, whatever killed it; SIGTERM ends the
child at once (SIGINT, which a terminal sends to the whole process group, is the parent's to handle).
When the child dies the parent's reader sees the pipe close: every open request gets an error, ``alive``
turns false (``/health`` answers 503) and new requests get 503.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.server.engine_loop import (
    Accepted,
    Draining,
    EngineLoop,
    Handle,
    Rejected,
    Tokens,
    check_room,
    max_running,
)
from servelab.server.heap import freeze_heap
from servelab.server.metrics import Observations, ServerMetrics
from servelab.server.supervision import die_with_parent

log = logging.getLogger("servelab.server")


class EngineStartError(RuntimeError):
    """The engine process failed while loading the model; the message has its traceback."""


def _portable(update):
    """Updates cross a pipe: exceptions become ParameterError (the client's fault) or RuntimeError (ours)."""
    if isinstance(update, Rejected) and not isinstance(update.error, ParameterError):
        return Rejected(RuntimeError(f"{type(update.error).__name__}: {update.error}"))
    return update


class _Child:
    """The engine process's side: an ``EngineLoop`` whose updates, gauges and observations go to the pipe."""

    def __init__(self, conn, engine, step_log_path: str | None):
        from servelab.server.step_log import StepLog

        self.conn = conn
        self._send_lock = threading.Lock()
        self.outbox: list = []
        self.observations = Observations()
        self.sent_gauges = None
        self.loop = EngineLoop(
            engine,
            step_log=StepLog(step_log_path) if step_log_path else None,
            after_iteration=self.flush,
            recorder=self.observations,
        )
        self.handles: dict[int, Handle] = {}

    def send(self, msg) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def flush(self) -> None:  # the engine thread, after each round: one message for all its updates
        # gauges go out with updates, and on their own when they changed in a round without any (an idle round
        # that ran a call): otherwise /metrics would keep the last busy round's values once the engine idles
        gauges = self.loop.gauges()
        if self.outbox or gauges != self.sent_gauges:
            items = self.outbox[:]
            del self.outbox[: len(items)]
            self.sent_gauges = gauges
            self.send(("updates", items, gauges, self.observations.take()))

    def serve(self) -> None:
        """Handle the parent's messages until it says drain, or goes away (then stop at once)."""
        self.loop.start()
        handlers = {"add": self.add, "abort": self.abort, "call": self.call}
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.loop.stop_now()
                return
            if msg[0] == "drain":
                clean = self.loop.drain(msg[1])
                self.send(("drained", clean))
                return
            handlers[msg[0]](*msg[1:])
            # finished requests' handles are dropped lazily: an abort of a finished one is a no-op in the loop
            if len(self.handles) > 4096:
                for rid in [r for r, h in self.handles.items() if h.done]:
                    del self.handles[rid]

    def add(self, rid: int, prompt_ids, params, arrival_s: float) -> None:
        def deliver(update, rid=rid):
            self.outbox.append((rid, _portable(update)))

        try:  # the parent checked the queue's room; the child's loop has no limit of its own
            self.handles[rid] = self.loop.submit(prompt_ids, params, deliver, arrival_s=arrival_s)
        except Draining as e:
            self.send(("updates", [(rid, Rejected(RuntimeError(str(e))))], self.loop.gauges(), []))

    def abort(self, rid: int) -> None:
        h = self.handles.pop(rid, None)
        if h is not None:
            self.loop.abort(h)

    def call(self, cid: int, fn, args) -> None:
        def reply(fut):
            err = fut.exception()
            self.send(("result", cid, err is None, fut.result() if err is None else f"{type(err).__name__}: {err}"))

        self.loop.call(lambda lp: fn(lp, *args)).add_done_callback(reply)


def engine_process_main(
    conn, build_engine: Callable, step_log_path: str | None, parent_pid: int | None = None, parent_end=None
) -> None:
    """The child: build the engine, then serve the parent's messages until it says drain (or goes away).
    ``parent_end``: the parent's end of the pipe, inherited by a fork, closed here so the pipe reports the
    parent's death."""
    if parent_end is not None:
        parent_end.close()
    if parent_pid is not None:
        die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group; only the parent decides when to drain. SIGTERM, sent to this
    # process alone, ends it at once (the kernel's default: no Python code needs to run).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        engine = build_engine()
    except BaseException:  # noqa: BLE001 - report any failure to load, then exit
        conn.send(("failed", traceback.format_exc()))
        return
    from servelab.server.tokenizer import special_ids

    child = _Child(conn, engine, step_log_path)
    frozen = freeze_heap()  # the engine is built, captured and compiled: nothing of it should be walked again
    child.send(
        (
            "ready",
            {
                "vocab": child.loop.vocab,
                "max_model_len": child.loop.max_model_len,
                "num_blocks": engine.num_blocks,
                "max_running": max_running(engine),
                "special_ids": special_ids(engine.model.config),
                "stats": engine.stats(),
                "device": str(engine.device),
                "pid": os.getpid(),
                "gc_frozen": frozen,
            },
        )
    )
    child.serve()


class EngineProcess:
    """The parent's proxy for the engine process; the same interface as ``EngineLoop``."""

    def __init__(
        self,
        build_engine: Callable,
        *,
        max_waiting: int | None = None,
        metrics: ServerMetrics | None = None,
        step_log_path: str | None = None,
        start_method: str | None = None,
    ):
        self.build_engine = build_engine
        self.start_method = start_method
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.step_log_path = step_log_path
        self.info: dict = {}
        self.proc = None
        self._handles: dict[int, Handle] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._draining = False
        self._dead = False
        # rids submitted and not yet answered by the child with Accepted, Rejected or an end (an abort before
        # admission ends with Tokens(ABORT) alone): a set, so no path can count one twice or leave one behind
        self._unadmitted: set[int] = set()
        self._count_lock = threading.Lock()
        self._drained_clean = False
        self._queued_in_engine = 0  # the child's scheduler queue after its last round
        self._running_in_engine = 0  # the child's running sequences after its last round
        self._drained = threading.Event()
        self._reader: threading.Thread | None = None
        self._calls: dict[int, Future] = {}

    # ---- lifecycle --------------------------------------------------------------------------------
    def launch(self, timeout_s: float = 1800.0) -> dict:
        """Start the engine process and wait until its engine is built; its info dict.

        ``start_method`` "spawn" (the default): a fresh interpreter; ``build_engine`` must be picklable (e.g. a
        ``functools.partial`` of ``Engine.from_spec``) and the imports take seconds. "fork" is instant, but only
        safe in a process that has neither initialised CUDA nor run a parallel torch op (OpenMP's thread pool
        does not survive a fork): ``python -m servelab.server`` forks first thing, before either.

        Call it from the main thread (or one that outlives the server): the kernel's parent-death signal
        fires when the thread that started the child exits."""
        method = self.start_method or "spawn"
        ctx = multiprocessing.get_context(method)
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=engine_process_main,
            # a fork inherits the parent's end, which the child must close; a spawn gets only what it is given
            args=(child, self.build_engine, self.step_log_path, os.getpid(), self._conn if method == "fork" else None),
            name="servelab-engine",
            daemon=True,
        )
        self.proc.start()
        child.close()
        return self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> dict:
        if not self._conn.poll(timeout_s):
            self.proc.kill()
            raise EngineStartError(f"the engine process did not report ready within {timeout_s:.0f} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            self.proc.join(5)
            raise EngineStartError(f"the engine process died while loading (exit code {self.proc.exitcode})") from None
        if kind == "failed":
            self.proc.join(10)
            raise EngineStartError(f"the engine process failed to load the model:\n{payload}")
        self.info = payload
        self.vocab, self.max_model_len = payload["vocab"], payload["max_model_len"]
        if self.metrics is not None:
            self.use_metrics(self.metrics)
        return payload

    def use_metrics(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        metrics.kv_total.set(self.info.get("num_blocks", 0))

    def start(self) -> EngineProcess:
        """Start reading the child's messages (in this process's serving phase)."""
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return not self._dead and self.proc is not None and self.proc.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: sent to the child and not yet admitted, plus its scheduler's queue."""
        return len(self._unadmitted) + self._queued_in_engine

    @property
    def free_slots(self) -> int:
        """Running slots free after the child's last round: the first waiting requests take them."""
        return max(0, self.info.get("max_running", 1) - self._running_in_engine)

    @property
    def num_open(self) -> int:
        """Requests sent and not finished (a drain ends when this is 0)."""
        return len(self._handles)

    def _send(self, msg) -> None:
        with self._send_lock:
            self._conn.send(msg)

    # ---- requests ---------------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, deliver: Callable[[object], None]) -> Handle:
        return self.submit_all([(prompt_ids, params, deliver)])[0]

    def submit_all(self, requests: list[tuple[list[int], SamplingParams, Callable]]) -> list[Handle]:
        """Send several requests (one HTTP request's prompts) all or none; ``Draining`` or ``QueueFull``
        leave nothing behind."""
        if self._draining:
            raise Draining("the server is shutting down")
        if not self.alive:
            raise Draining("the engine process has stopped")
        now = time.perf_counter()
        handles = [Handle(list(p), sp, deliver, arrival_s=now, rid=next(self._ids)) for p, sp, deliver in requests]
        with self._count_lock:
            check_room(self.num_waiting, len(handles), self.max_waiting, self.free_slots)
            for h in handles:
                self._handles[h.rid] = h
                self._unadmitted.add(h.rid)
        for h in handles:
            self._send(("add", h.rid, h.prompt_ids, h.params, h.arrival_s))
        return handles

    def abort(self, handle: Handle) -> None:
        handle.cancelled = True
        if not handle.done and not self._dead:
            self._send(("abort", handle.rid))

    def call(self, fn: Callable, *args, timeout_s: float = 120.0):
        """``fn(engine_loop, *args)`` in the engine process, between two steps; its result. ``fn`` and
        ``args`` cross a pipe: a module-level function and picklable arguments. ``engine_loop.engine`` is the
        engine (e.g. swap its scheduler while idle); ``RuntimeError`` if it raised there."""
        if self._dead:
            raise RuntimeError("the engine process has stopped")
        cid, fut = next(self._ids), Future()
        self._calls[cid] = fut
        self._send(("call", cid, fn, args))
        ok, value = fut.result(timeout_s)
        if not ok:
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in the engine process: {value}")
        return value

    def begin_drain(self) -> None:
        self._draining = True

    def stop_now(self) -> None:
        """End the engine process at once (a second Ctrl-C): SIGTERM, which it does not catch. The reader
        then fails every open request and ``drain`` returns. Safe in a signal handler."""
        self._draining = True
        if self.proc is not None and self.proc.is_alive():
            self.proc.terminate()

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Let the child finish its requests and exit; whether it finished them all in time. Returns early
        if the child dies (or ``stop_now`` ends it)."""
        self._draining = True
        if self._dead or not self.proc.is_alive():
            self.proc.join(5.0)
            return False
        with contextlib.suppress(OSError):  # the child may have died meanwhile: the reader then sets _drained
            self._send(("drain", timeout_s))
        clean = self._drained.wait(timeout_s + 15.0) and self._drained_clean
        self.proc.join(15.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
            clean = False
        return clean

    # ---- the reader thread --------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "drained":
                self._drained_clean = msg[1]
                self._drained.set()
                break
            if msg[0] == "result":
                fut = self._calls.pop(msg[1], None)
                if fut is not None:
                    fut.set_result((msg[2], msg[3]))
                continue
            self._on_updates(*msg[1:])
        self._on_child_gone()

    def _on_updates(self, items, gauges: dict, observations) -> None:
        for rid, update in items:
            h = self._handles.get(rid)
            if h is not None:
                self._on_update(h, update)
        self._queued_in_engine = gauges["queued"]
        self._running_in_engine = gauges["running"]
        if self.metrics is not None:
            self.metrics.replay(observations)
            self.metrics.set_gauges(gauges | {"waiting": self.num_waiting})

    def _on_update(self, h: Handle, update) -> None:
        ended = isinstance(update, Rejected) or (isinstance(update, Tokens) and update.finish_reason is not None)
        if isinstance(update, Accepted):
            h.accepted = True
        if isinstance(update, Accepted) or ended:
            with self._count_lock:
                self._unadmitted.discard(h.rid)
        if ended:
            h.done = True
            self._handles.pop(h.rid, None)
        try:
            h.deliver(update)
        except Exception:  # noqa: BLE001 - e.g. the event loop is closed: nobody listens
            log.debug("deliver failed", exc_info=True)

    def _on_child_gone(self) -> None:
        """Nobody will answer the requests still open: each gets an error, and the queue empties."""
        if not self._drained.is_set():
            code = self.proc.exitcode if self.proc is not None else None
            log.error("the engine process stopped (exit code %s); failing the requests in flight", code)
        self._dead = True
        self._drained.set()
        for fut in self._calls.values():
            fut.set_result((False, "the engine process stopped"))
        with self._count_lock:
            self._unadmitted.clear()
            self._queued_in_engine = 0
            open_handles, self._handles = list(self._handles.values()), {}
        for h in open_handles:
            if not h.done:
                h.done = True
                with contextlib.suppress(Exception):
                    h.deliver(Rejected(RuntimeError("the engine process stopped")))
        if self.metrics is not None:
            self.metrics.set_gauges({"waiting": 0, "running": 0, "kv_used": 0, "kv_total": self.info.get("num_blocks")})
