"""One model served over HTTP, its scheduling policy switched between runs: ``PolicyServer``.

Study 1 compares policies on the same weights, KV pool and CUDA graphs. Loading a model and capturing its
graphs costs seconds (more for the 8B shape) and the study's GPU budget is a few minutes, so the model is
loaded once per size and served by ``servelab.server``; between runs, while the engine is idle, ``use_policy``
puts a fresh scheduler of the asked policy and budget over the same block manager, the only state a policy
owns, then warms the policy up with one short request, so that one-off costs (the first launch of a kernel
at a new shape) land before the next run's clock starts.

By default the engine runs in a process of its own (``servelab.server.engine_process.EngineProcess``) and
only the HTTP server runs in this one (``ServerThread``): an engine thread that shared this interpreter's
GIL with uvicorn's threads waited for it at every eager kernel launch, which stretched prefill and mixed
steps many times over. ``engine_process=False`` keeps the old in-process mode (one engine thread here).
Either way the policy swap, the idle check and the step-log flush are module-level functions below that
run in the engine's own thread between two steps (``EngineLoop.call`` / ``EngineProcess.call``), the only
safe time to touch the engine. The load generator runs in another process (``servelab.loadgen.worker``).

The engine is built with the largest token budget any run uses (its activation memory is planned for it);
a policy's budget may be smaller, never larger. Every engine step goes to a JSONL step log (the server's
``--step-log``); ``steps_between`` reads the steps of one run by time window.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import httpx
import pandas as pd

from servelab.engine import Engine, EngineConfig
from servelab.engine.policies import policy_class
from servelab.errors import ParameterError

WARMUP_PROMPT_TOKENS = 8  # a short prompt: one small prefill step ...
WARMUP_OUTPUT_TOKENS = 2  # ... and one decode step under the new policy
CALL_TIMEOUT_S = 120.0  # one call into the engine's thread (it waits for the current step to end)


def graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes to capture: powers of two up to ``max_num_seqs``, and it (fewer graphs, faster start)."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_num_seqs])


# ---- run in the engine's thread (this process or the engine process), between two steps ----------------
def swap_policy(loop, name: str, budget: int) -> tuple[str, int]:
    """Replace the idle engine's scheduler by a fresh ``name`` scheduler with ``budget`` tokens per step."""
    eng = loop.engine
    eng.set_policy(name, budget)
    return eng.config.scheduler, eng.scheduler.max_num_batched_tokens


def idle_state(loop) -> dict:
    """What still occupies the engine: unfinished requests, scheduler queues, used KV blocks."""
    eng = loop.engine
    return {
        "unfinished": eng.has_unfinished(),
        "waiting": len(eng.scheduler.waiting),
        "running": len(eng.scheduler.running),
        "used_blocks": eng.kv_blocks()[0],
    }


def flush_step_log(loop) -> None:
    """Write the buffered step records out, so that the file holds every step taken so far."""
    if loop.step_log is not None:
        loop.step_log.flush()


def engine_facts(loop) -> dict:
    """What the study records about the loaded engine: vocabulary, dtype bytes, model shape, device, stats."""
    eng = loop.engine
    return {
        "vocab": eng.model.shape.vocab,
        "dtype_bytes": eng.dtype.itemsize,
        "shape": eng.model.shape,
        "device_type": eng.device.type,
        "stats": {k: v for k, v in eng.stats().items() if not isinstance(v, dict)},
    }


def release_cached_memory(loop) -> None:
    """Return the caching allocator's free blocks to the GPU (after a failed run, e.g. an OOM)."""
    if loop.engine.device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


class PolicyServer:
    """``with PolicyServer(spec, dtype=..., device=..., max_num_seqs=..., ...) as srv:`` then
    ``srv.use_policy("chunked_prefill", 512)``, ``srv.base_url``, ``srv.steps_between(t0, t1)``.

    ``engine_process=True``: the engine in a child process (a fresh interpreter: its imports add seconds to
    ``load_s``), HTTP here; ``False``: both in this process. ``warmup=False`` skips the warm-up request."""

    def __init__(
        self,
        spec: str,
        *,
        dtype: str,
        device: str,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        num_blocks: int | None,
        step_log_path,
        seed: int = 0,
        engine_process: bool = True,
        warmup: bool = True,
    ):
        self.spec, self.dtype, self.device = spec, dtype, device
        self.config = EngineConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            num_blocks=num_blocks,
            graph_batch_sizes=graph_sizes(max_num_seqs),
            scheduler="eager_cont_batch",
        )
        self.seed = seed
        self.engine_process = bool(engine_process)
        self.warmup = bool(warmup)
        self.step_log_path = Path(step_log_path)
        self.engine: Engine | None = None  # in-process mode only; the engine process keeps its own
        self.thread = None  # the ServerThread (uvicorn)
        self._ep = None  # the EngineProcess, in engine-process mode
        self._step_log = None  # the StepLog, in in-process mode (the child writes its own)
        self.facts: dict = {}
        self.load_s = float("nan")  # model load (+ the child's interpreter start) until serving, s
        self.last_warmup_s = float("nan")  # the last warm-up request's wall time, s
        self._policy = (self.config.scheduler, max_num_batched_tokens)

    def start(self) -> PolicyServer:
        from servelab.server.launch import ServerThread

        t = time.perf_counter()
        if self.step_log_path.exists():
            self.step_log_path.unlink()
        build = functools.partial(
            Engine.from_spec, self.spec, dtype=self.dtype, device=self.device, config=self.config, seed=self.seed
        )
        if self.engine_process:
            import torch

            from servelab.server.engine_process import EngineProcess

            if torch.cuda.is_initialized():  # hand this process's cached blocks (the ceilings' buffers) to the child
                torch.cuda.empty_cache()
            self._ep = EngineProcess(build, step_log_path=str(self.step_log_path))
            self._ep.launch()
            self.thread = ServerThread(self._ep).start()
        else:
            from servelab.server.step_log import StepLog

            self.engine = build()
            self._step_log = StepLog(self.step_log_path)
            self.thread = ServerThread(self.engine, step_log=self._step_log).start()
        self.load_s = time.perf_counter() - t
        self.facts = self._call(engine_facts)
        return self

    # ---- the engine's thread ----------------------------------------------------------------------
    def _call(self, fn, *args):
        """``fn(engine_loop, *args)`` in the engine's thread between two steps; its result."""
        if self.thread is None:
            raise RuntimeError("the server is not running")
        if self._ep is not None:
            return self._ep.call(fn, *args, timeout_s=CALL_TIMEOUT_S)
        loop = self.thread.state.loop
        if not loop.alive:  # nobody would run it
            raise RuntimeError(f"the engine thread has stopped: {self.error or 'no error recorded'}")
        return loop.call(lambda lp: fn(lp, *args)).result(CALL_TIMEOUT_S)

    @property
    def base_url(self) -> str:
        return self.thread.base_url

    @property
    def vocab(self) -> int:
        return self.facts["vocab"]

    @property
    def shape(self):
        """The served model's ``ModelShape``."""
        return self.facts["shape"]

    @property
    def dtype_bytes(self) -> int:
        return self.facts["dtype_bytes"]

    @property
    def stats(self) -> dict:
        """The engine's scalar stats right after it loaded (backend, graphs, KV pool GiB, ...)."""
        return self.facts["stats"]

    @property
    def policy(self) -> tuple[str, int]:
        """The policy in use and its budget (tokens per step)."""
        return self._policy

    @property
    def engine_child(self):
        """The engine's process (a ``multiprocessing.Process``) in engine-process mode, else None."""
        return getattr(self._ep, "proc", None)

    @property
    def alive(self) -> bool:
        """Whether the engine is still stepping (a step that raised, or a dead engine process, stops it)."""
        return self.thread is not None and self.thread.state.loop.alive

    @property
    def error(self) -> str:
        if self.thread is None:
            return ""
        loop = self.thread.state.loop
        err = getattr(loop, "error", None)
        if err is not None:
            return f"{type(err).__name__}: {err}"
        proc = getattr(self._ep, "proc", None)
        if proc is not None and not proc.is_alive():
            return f"the engine process exited (code {proc.exitcode})"
        return ""

    def idle_state(self) -> dict:
        """The engine's ``unfinished``, ``waiting``, ``running`` and ``used_blocks`` (KV blocks), read between steps."""
        return self._call(idle_state)

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no request is queued or running and every KV block is free (after a run, cut
        requests are aborted as their connections close); ``TimeoutError`` otherwise, ``RuntimeError``
        at once if the engine has stopped."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                raise RuntimeError(f"the engine stopped: {self.error or 'no error recorded'}")
            state = self.idle_state()
            queued = self.thread.state.loop.num_waiting  # submitted over HTTP, not yet admitted
            if not (state["unfinished"] or state["used_blocks"] or queued):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"engine not idle after {timeout_s:.0f} s: {state['waiting']} waiting, "
                    f"{state['running']} running, {state['used_blocks']} blocks, {queued} queued"
                )
            time.sleep(0.02)

    def use_policy(self, name: str, budget: int) -> None:
        """Switch to policy ``name`` with ``budget`` tokens per step (at most the engine's), once idle; then
        serve one short warm-up request under it and wait until idle again (``last_warmup_s``)."""
        top = self.config.max_num_batched_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or not self.config.max_num_seqs <= budget <= top:
            raise ParameterError(
                f"budget must be an integer in [max_num_seqs={self.config.max_num_seqs}, {top}] "
                f"(the engine's activation memory is planned for {top}), got {budget!r}"
            )
        policy_class(name)  # ParameterError here for an unknown name, not a RuntimeError from the engine's thread
        self.wait_idle()
        self._policy = self._call(swap_policy, name, budget)
        if self.warmup:
            self.last_warmup_s = self.warm_up()

    def warm_up(self) -> float:
        """One short request over HTTP (``WARMUP_PROMPT_TOKENS`` in, ``WARMUP_OUTPUT_TOKENS`` out), then wait
        until idle; its wall time (s). Its steps start before the next run's ``t0``, so ``steps_between`` over
        that run's window leaves them out."""
        t = time.perf_counter()
        prompt = [(7 + 13 * i) % self.vocab for i in range(WARMUP_PROMPT_TOKENS)]
        body = {"prompt": prompt, "max_tokens": WARMUP_OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=CALL_TIMEOUT_S)
        if r.status_code != 200:
            raise RuntimeError(f"warm-up request failed: HTTP {r.status_code}: {r.text[:300]}")
        self.wait_idle()
        return time.perf_counter() - t

    def steps_between(self, t0: float, t1: float) -> pd.DataFrame:
        """The engine steps that started in ``[t0, t1]`` (``time.perf_counter`` s), from the step log."""
        from servelab.server.step_log import read_step_log

        self._call(flush_step_log)
        steps = read_step_log(self.step_log_path)
        return steps[(steps["start_s"] >= t0) & (steps["start_s"] <= t1)].reset_index(drop=True)

    def release_cached_memory(self) -> None:
        """Free the engine's cached, unused GPU memory (after a failed run); a no-op on CPU."""
        self._call(release_cached_memory)

    def stop(self) -> None:
        """Drain and stop the HTTP server and the engine (its thread, or its process), release its GPU memory."""
        if self.thread is not None:
            self.thread.stop()  # drains the engine loop; an engine process exits
            self.thread = None
        proc = getattr(self._ep, "proc", None)
        if proc is not None and proc.is_alive():  # the server never started, or did not drain in time
            proc.kill()
            proc.join(10.0)
        self._ep = None
        if self._step_log is not None:
            self._step_log.close()
            self._step_log = None
        if self.engine is not None:
            dev = self.engine.device
            self.engine = None
            if dev.type == "cuda":
                import gc

                import torch

                gc.collect()
                torch.cuda.empty_cache()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
