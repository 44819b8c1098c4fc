"""The engine in a process of its own, so that HTTP work never competes with it for the GIL.

One Python process serving HTTP and stepping the engine runs both on one GIL: formatting and sending
tens of thousands of SSE chunks a second would stretch the engine's steps, and Study 1 would measure
Python contention instead of scheduling (vLLM's V1 splits its API server from its engine core for the
same reason). ``python -m servelab.server`` therefore forks an engine process before it loads anything
on the GPU: the child builds the engine and runs an ``EngineLoop``; the parent serves HTTP. From any other
process (a notebook that has used torch already) the child is spawned instead.

They talk over one ``multiprocessing.Pipe``: the parent sends ``("add", rid, prompt_ids, params)``,
``("abort", rid)``, ``("call", cid, fn, args)`` and ``("drain", timeout_s)``; the child sends
``("ready", info)`` once, then one ``("updates", [(rid, update), ...], gauges)`` message per engine round
(not one per token), ``("result", cid, ok, value)`` per call, and ``("drained", clean)`` at the end. ``EngineProcess`` is the parent's proxy and offers the same interface
as ``EngineLoop`` (``submit``, ``abort``, ``begin_drain``, ``drain``, ...), so the app uses either.

TTFT and inter-token histograms are observed in the parent when updates arrive (they include the
pipe's few tens of µs); the step log is written by the child.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from servelab.engine import SamplingParams
from servelab.errors import ParameterError
from servelab.server.engine_loop import Accepted, Draining, EngineLoop, Handle, QueueFull, Rejected, Tokens
from servelab.server.metrics import ServerMetrics

log = logging.getLogger("servelab.server")


class EngineStartError(RuntimeError):
    """The engine process failed while loading the model; the message has its traceback."""


def _portable(update):
    """Updates cross a pipe: exceptions become ParameterError (the client's fault) or RuntimeError (ours)."""
    if isinstance(update, Rejected) and not isinstance(update.error, ParameterError):
        return Rejected(RuntimeError(f"{type(update.error).__name__}: {update.error}"))
    return update


def engine_process_main(conn, build_engine: Callable, step_log_path: str | None) -> None:
    """The child: build the engine, then serve the parent's messages until it says drain (or goes away)."""
    # Ctrl-C reaches the whole process group; only the parent decides when the engine stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = build_engine()
    except BaseException:  # noqa: BLE001 - report any failure to load, then exit
        conn.send(("failed", traceback.format_exc()))
        return
    from servelab.server.step_log import StepLog
    from servelab.server.tokenizer import special_ids

    send_lock = threading.Lock()
    outbox: list = []

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    sent_gauges: list = [None]

    def flush() -> None:  # the engine thread, after each round: one message for all its updates
        # gauges go out with updates, and on their own when they changed in a round without any (an idle round
        # that ran a call): otherwise /metrics would keep the last busy round's values once the engine idles
        gauges = loop.gauges()
        if outbox or gauges != sent_gauges[0]:
            items = outbox[:]
            del outbox[: len(items)]
            sent_gauges[0] = gauges
            send(("updates", items, gauges))

    loop = EngineLoop(engine, step_log=StepLog(step_log_path) if step_log_path else None, after_iteration=flush)
    handles: dict[int, Handle] = {}
    send(
        (
            "ready",
            {
                "vocab": loop.vocab,
                "max_model_len": loop.max_model_len,
                "num_blocks": engine.num_blocks,
                "special_ids": special_ids(engine.model.config),
                "stats": engine.stats(),
                "device": str(engine.device),
            },
        )
    )
    loop.start()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone: stop at once
            loop.drain(0.0)
            return
        kind = msg[0]
        if kind == "add":
            _, rid, prompt_ids, params = msg

            def deliver(update, rid=rid):
                outbox.append((rid, _portable(update)))

            try:
                handles[rid] = loop.submit(prompt_ids, params, deliver)
            except (Draining, QueueFull) as e:
                send(("updates", [(rid, Rejected(RuntimeError(str(e))))], loop.gauges()))
        elif kind == "abort":
            h = handles.pop(msg[1], None)
            if h is not None:
                loop.abort(h)
        elif kind == "call":
            _, cid, fn, args = msg

            def reply(fut, cid=cid):
                err = fut.exception()
                send(("result", cid, err is None, fut.result() if err is None else f"{type(err).__name__}: {err}"))

            loop.call(lambda lp, fn=fn, args=args: fn(lp, *args)).add_done_callback(reply)
        elif kind == "drain":
            clean = loop.drain(msg[1])
            send(("drained", clean))
            return
        # finished requests' handles are dropped lazily: an abort of a finished one is a no-op in the loop
        if len(handles) > 4096:
            for rid in [r for r, h in handles.items() if h.done]:
                del handles[rid]


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
        self._handles: dict[int, Handle] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._draining = False
        self._dead = False
        self._unadmitted = 0  # submitted, not yet accepted or rejected by the child
        self._count_lock = threading.Lock()
        self._drained_clean = False
        self._waiting_in_engine = 0
        self._drained = threading.Event()
        self._reader: threading.Thread | None = None
        self._calls: dict[int, Future] = {}

    # ---- lifecycle --------------------------------------------------------------------------------
    def launch(self, timeout_s: float = 1800.0) -> dict:
        """Start the engine process and wait until its engine is built; its info dict.

        ``start_method`` "spawn" (the default): a fresh interpreter; ``build_engine`` must be picklable (e.g. a
        ``functools.partial`` of ``Engine.from_spec``) and the imports take seconds. "fork" is instant, but only
        safe in a process that has neither initialised CUDA nor run a parallel torch op (OpenMP's thread pool
        does not survive a fork): ``python -m servelab.server`` forks first thing, before either."""
        ctx = multiprocessing.get_context(self.start_method or "spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=engine_process_main,
            args=(child, self.build_engine, self.step_log_path),
            name="servelab-engine",
            daemon=True,
        )
        self.proc.start()
        child.close()
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
    def alive(self) -> bool:
        return not self._dead and self.proc.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def num_waiting(self) -> int:
        return self._unadmitted + self._waiting_in_engine

    def _send(self, msg) -> None:
        with self._send_lock:
            self._conn.send(msg)

    # ---- requests ---------------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, deliver: Callable[[object], None]) -> Handle:
        if self._draining:
            raise Draining("the server is shutting down")
        if self._dead:
            raise Draining("the engine process has stopped")
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise QueueFull(f"{self.num_waiting} requests are waiting (limit {self.max_waiting})")
        h = Handle(list(prompt_ids), params, deliver, rid=next(self._ids))
        self._handles[h.rid] = h
        with self._count_lock:
            self._unadmitted += 1
        self._send(("add", h.rid, h.prompt_ids, params))
        return h

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

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Let the child finish its requests and exit; whether it finished them all in time."""
        self._draining = True
        if self._dead or not self.proc.is_alive():
            return False
        self._send(("drain", timeout_s))
        clean = self._drained.wait(timeout_s + 15.0) and self._drained_clean
        self.proc.join(15.0)
        if self.proc.is_alive():
            self.proc.kill()
            clean = False
        return clean

    # ---- the reader thread --------------------------------------------------------------------------
    def _read(self) -> None:
        m = self.metrics
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
            _, items, gauges = msg
            now = time.perf_counter()
            for rid, update in items:
                h = self._handles.get(rid)
                if h is None:
                    continue
                if isinstance(update, Accepted):
                    h.accepted = True
                    with self._count_lock:
                        self._unadmitted -= 1
                elif isinstance(update, Rejected):
                    if not h.accepted:
                        with self._count_lock:
                            self._unadmitted -= 1
                    h.done = True
                    self._handles.pop(rid, None)
                elif isinstance(update, Tokens):
                    if update.token_ids and m is not None:
                        if h.last_token_s is None:
                            m.ttft.observe(now - h.arrival_s)
                        else:
                            m.itl.observe(now - h.last_token_s)
                        for _ in update.token_ids[1:]:
                            m.itl.observe(0.0)
                        m.generated.inc(len(update.token_ids))
                    if update.token_ids:
                        h.last_token_s = now
                    if update.finish_reason is not None:
                        h.done = True
                        self._handles.pop(rid, None)
                try:
                    h.deliver(update)
                except Exception:  # noqa: BLE001 - e.g. the event loop is closed: nobody listens
                    log.debug("deliver failed", exc_info=True)
            self._waiting_in_engine = gauges["waiting"]
            if m is not None:
                m.set_gauges(gauges)
        # the child is gone: nobody will answer the requests still open
        self._dead = True
        self._drained.set()
        for fut in self._calls.values():
            fut.set_result((False, "the engine process stopped"))
        for h in list(self._handles.values()):
            if not h.done:
                h.done = True
                try:
                    h.deliver(Rejected(RuntimeError("the engine process stopped")))
                except Exception:  # noqa: BLE001
                    pass
        self._handles.clear()
