"""A probe of where a process's long host stalls go: imported by every Python process started with this folder on
PYTHONPATH while SERVELAB_STALL_PROBE names an output prefix (scripts/gpu_dev.sh host-stalls).

It changes no measuring code. It records, on time.perf_counter's clock (CLOCK_MONOTONIC, so the engine's step log
and these records line up across processes), to ``<prefix>.<pid>.jsonl``:

- ``triton``: each Triton JIT compile in this process, from ``knobs.runtime.jit_cache_hook`` (before the compile,
  whether or not the on-disk cache has the binary) to ``jit_post_compile_hook``, with the kernel and its key;
- ``dynamo``: each torch.compile compilation (torch._dynamo.callback's start and end);
- ``gc``: each garbage collection of 2 ms or more, with its generation;
- ``stack``: every 20 ms, each thread's innermost frames (deduplicated as ``stacks``), so a stall that none of the
  above explains still shows where the thread was.

Hooks go in from a daemon thread once ``triton`` and ``torch._dynamo`` are imported, so a process that never
imports them pays nothing for them.
"""

import gc
import json
import os
import sys
import threading
import time

_PREFIX = os.environ.get("SERVELAB_STALL_PROBE")
_clock = time.perf_counter


class _Probe:
    """The records of one process, buffered and appended to its file every 2 s (and at exit)."""

    def __init__(self, prefix: str):
        self.path = f"{prefix}.{os.getpid()}.jsonl"
        self.lock = threading.Lock()
        self.buf: list[str] = []
        self.stacks: dict[tuple, int] = {}
        self.open: dict[str, float] = {}  # start times of collections and compiles under way
        self.emit({"kind": "process", "t": _clock(), "argv": sys.argv[:6]})

    def emit(self, rec: dict) -> None:
        with self.lock:
            self.buf.append(json.dumps(rec, default=str))

    def flush(self) -> None:
        with self.lock:
            lines, self.buf = self.buf, []
        if lines:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")

    # ---- garbage collections ----
    def on_gc(self, phase, info) -> None:
        if phase == "start":
            self.open["gc"] = _clock()
            return
        t0 = self.open.pop("gc", None)
        if t0 is not None and _clock() - t0 >= 0.002:
            self.emit(
                {
                    "kind": "gc",
                    "t0": t0,
                    "t1": _clock(),
                    "gen": info.get("generation"),
                    "collected": info.get("collected"),
                }
            )

    # ---- Triton JIT compiles (knobs.runtime hooks: a truthy return would skip the compile) ----
    @staticmethod
    def _kernel(kw) -> str:
        fn = kw.get("fn")  # Triton's JitFunctionInfo: module, name, jit_function
        name = getattr(fn, "name", None) or str(kw.get("repr", "?")).split("[", 1)[0]
        return f"{name}\x00{str(kw.get('key', ''))[:400]}"

    def triton_before(self, *args, **kw):
        self.open[self._kernel(kw)] = _clock()

    def triton_after(self, *args, **kw):
        kernel = self._kernel(kw)
        name, key = kernel.split("\x00", 1)
        self.emit({"kind": "triton", "t0": self.open.pop(kernel, None), "t1": _clock(), "fn": name, "key": key})

    # ---- torch.compile compilations ----
    def dynamo_start(self, *args, **kw):
        self.open["dynamo"] = _clock()

    def dynamo_end(self, *args, **kw):
        a = args[0] if args else None
        self.emit(
            {
                "kind": "dynamo",
                "t0": self.open.pop("dynamo", None),
                "t1": _clock(),
                "trigger": str(getattr(a, "callback_trigger", "")),
                "id": str(getattr(a, "compile_id", "")),
            }
        )

    def _hook(self, what: str) -> None:
        try:
            if what == "triton":
                from triton import knobs

                knobs.runtime.jit_cache_hook = self.triton_before
                knobs.runtime.jit_post_compile_hook = self.triton_after
            else:
                from torch._dynamo import callback

                callback.on_compile_start(self.dynamo_start)
                callback.on_compile_end(self.dynamo_end)
            self.emit({"kind": "hooked", "what": what, "t": _clock()})
        except Exception as e:  # a Triton or torch without these hooks
            self.emit({"kind": "hook_failed", "what": what, "error": repr(e)})

    def install_hooks(self) -> None:
        waiting = {"triton": "triton", "dynamo": "torch._dynamo"}
        while waiting:
            for what, module in list(waiting.items()):
                if module in sys.modules:
                    self._hook(what)
                    del waiting[what]
            time.sleep(0.05)

    # ---- stacks ----
    def _stack_id(self, frame) -> int:
        frames = []
        while frame is not None and len(frames) < 14:
            c = frame.f_code
            frames.append(f"{'/'.join(c.co_filename.rsplit('/', 3)[-3:])}:{frame.f_lineno}:{c.co_name}")
            frame = frame.f_back
        key = tuple(frames)
        sid = self.stacks.get(key)
        if sid is None:
            sid = self.stacks[key] = len(self.stacks)
            self.emit({"kind": "stacks", "id": sid, "frames": frames})
        return sid

    def sample(self) -> None:
        while True:
            time.sleep(0.02)
            t = _clock()
            mine = {th.ident for th in threading.enumerate() if th.name.startswith("stall_probe")}
            for tid, frame in sys._current_frames().items():
                if tid not in mine:
                    self.emit({"kind": "stack", "t": t, "tid": tid, "id": self._stack_id(frame)})

    def flusher(self) -> None:
        while True:
            time.sleep(2.0)
            self.flush()

    def start(self) -> None:
        import atexit

        gc.callbacks.append(self.on_gc)
        for target in (self.install_hooks, self.sample, self.flusher):
            threading.Thread(target=target, daemon=True, name=f"stall_probe_{target.__name__}").start()
        atexit.register(self.flush)


if _PREFIX:
    try:
        _Probe(_PREFIX).start()
    except Exception as e:  # the probe must never stop the process it watches
        print(f"stall_probe: not started: {e!r}", flush=True)
