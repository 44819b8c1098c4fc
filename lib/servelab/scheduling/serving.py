"""One model served over HTTP, its scheduling policy switched between runs: ``PolicyServer``.

Study 1 compares policies on the same weights, KV pool and CUDA graphs. Loading a model and capturing its
graphs costs seconds (more for the 8B shape) and the study's GPU budget is four minutes, so the model is
loaded once per size and served by ``servelab.server`` in this process (``ServerThread``: uvicorn and the
engine thread); between runs, while the engine is idle, ``use_policy`` puts a fresh scheduler of the asked
policy and budget over the same block manager, the only state a policy owns. The load generator runs in
another process (``servelab.loadgen.worker``) so the client's timestamps never wait on this process's GIL.

The engine is built with the largest token budget any run uses (its activation memory is planned for it);
a policy's budget may be smaller, never larger. Every engine step goes to a JSONL step log (the server's
``--step-log``); ``steps_between`` reads the steps of one run.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pandas as pd

from servelab.engine import Engine, EngineConfig
from servelab.engine.policies import policy_class
from servelab.profiles import ParameterError


def graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes to capture: powers of two up to ``max_num_seqs``, and it (fewer graphs, faster start)."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_num_seqs])


class PolicyServer:
    """``with PolicyServer(spec, dtype=..., device=..., max_num_seqs=..., ...) as srv:`` then
    ``srv.use_policy("chunked_prefill", 512)``, ``srv.base_url``, ``srv.steps_between(t0, t1)``."""

    def __init__(self, spec: str, *, dtype: str, device: str, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, num_blocks: int | None, step_log_path, seed: int = 0):
        self.spec, self.dtype, self.device = spec, dtype, device
        self.config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   max_model_len=max_model_len, num_blocks=num_blocks,
                                   graph_batch_sizes=graph_sizes(max_num_seqs), scheduler="eager_cont_batch")
        self.seed = seed
        self.step_log_path = Path(step_log_path)
        self.engine: Engine | None = None
        self.thread = None
        self.load_s = float("nan")

    def start(self) -> "PolicyServer":
        from servelab.server.launch import ServerThread
        from servelab.server.step_log import StepLog

        t = time.perf_counter()
        self.engine = Engine.from_spec(self.spec, dtype=self.dtype, device=self.device, config=self.config,
                                       seed=self.seed)
        self.load_s = time.perf_counter() - t
        if self.step_log_path.exists():
            self.step_log_path.unlink()
        self.step_log = StepLog(self.step_log_path)
        self.thread = ServerThread(self.engine, step_log=self.step_log).start()
        return self

    @property
    def base_url(self) -> str:
        return self.thread.base_url

    @property
    def vocab(self) -> int:
        return self.engine.model.shape.vocab

    @property
    def policy(self) -> tuple[str, int]:
        return self.engine.config.scheduler, self.engine.scheduler.max_num_batched_tokens

    @property
    def alive(self) -> bool:
        """Whether the engine thread is still stepping (a step that raised may have stopped it)."""
        return self.thread is not None and self.thread.state.loop.alive

    @property
    def error(self) -> str:
        err = self.thread.state.loop.error if self.thread is not None else None
        return "" if err is None else f"{type(err).__name__}: {err}"

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no request is queued or running and every KV block is free (after a run, cut
        requests are aborted as their connections close); ``TimeoutError`` otherwise, ``RuntimeError``
        at once if the engine thread has stopped."""
        deadline = time.monotonic() + timeout_s
        eng = self.engine
        while eng.has_unfinished() or eng.block_manager.num_used_blocks or self.thread.state.loop.num_waiting:
            if not self.alive:
                raise RuntimeError(f"the engine thread stopped: {self.error or 'no error recorded'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine not idle after {timeout_s:.0f} s: {len(eng.scheduler.waiting)} waiting, "
                                   f"{len(eng.scheduler.running)} running, {eng.block_manager.num_used_blocks} blocks")
            time.sleep(0.02)

    def use_policy(self, name: str, budget: int) -> None:
        """Switch to policy ``name`` with ``budget`` tokens per step (at most the engine's), once idle."""
        top = self.config.max_num_batched_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or not self.config.max_num_seqs <= budget <= top:
            raise ParameterError(f"budget must be an integer in [max_num_seqs={self.config.max_num_seqs}, {top}] "
                                 f"(the engine's activation memory is planned for {top}), got {budget!r}")
        cls = policy_class(name)
        self.wait_idle()
        eng = self.engine
        eng.scheduler = cls(eng.block_manager, max_num_seqs=self.config.max_num_seqs, max_num_batched_tokens=budget,
                            eos_token_ids=eng.scheduler.eos_token_ids)
        eng.config = dataclasses.replace(eng.config, scheduler=name, max_num_batched_tokens=budget)

    def steps_between(self, t0: float, t1: float) -> pd.DataFrame:
        """The engine steps that started in ``[t0, t1]`` (``time.perf_counter`` s), from the step log."""
        from servelab.server.step_log import read_step_log

        self.step_log.flush()
        steps = read_step_log(self.step_log_path)
        return steps[(steps["start_s"] >= t0) & (steps["start_s"] <= t1)].reset_index(drop=True)

    def stop(self) -> None:
        """Drain and stop the HTTP server and engine thread, release the engine (and its GPU memory)."""
        if self.thread is not None:
            self.thread.stop()
            self.thread = None
        if getattr(self, "step_log", None) is not None:
            self.step_log.close()
        if self.engine is not None:
            dev = self.engine.device
            self.engine = None
            if dev.type == "cuda":
                import gc

                import torch

                gc.collect()
                torch.cuda.empty_cache()

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
