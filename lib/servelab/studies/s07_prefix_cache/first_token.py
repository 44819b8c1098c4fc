"""Time requests through the engine with the prefix cache cold, warm or off.

Every measurement runs on one engine (one KV pool, one set of CUDA graphs) and switches prefix caching
between repeats with ``Engine.set_prefix_caching``: ``cached`` means caching on and the cache primed with
what a server would already hold (another request with the same prefix, or the conversation so far);
``uncached`` means caching off, so the whole prompt is prefilled. Times come from ``time_fn`` (CUDA events
on the GPU, medians with quartiles); the priming runs untimed in ``before_each``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab.engine import Engine, SamplingParams
from servelab.measure import time_fn

MODES = ("uncached", "cached")


def random_tokens(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    """``n`` random token ids in [3, vocab): random prompts, never all zeros, clear of the usual special ids."""
    return rng.integers(3, vocab, size=n).tolist()


class StepCounter:
    """Counts the tokens the engine computes and the wall time of its steps while ``active``."""

    def __init__(self, engine: Engine):
        self.active = False
        self.tokens = 0
        self.step_s = 0.0
        engine.on_step = self

    def __call__(self, rec) -> None:
        if self.active:
            self.tokens += rec.prefill_tokens + rec.decode_tokens
            self.step_s += rec.end_s - rec.start_s

    def reset(self) -> None:
        self.tokens, self.step_s = 0, 0.0


def run_requests(engine: Engine, prompts: Sequence[list[int]], max_tokens: int = 1) -> None:
    """Submit ``prompts`` together and step until all are done (greedy, ``max_tokens`` each)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    while not all(s.is_finished for s in seqs):
        engine.step()


def time_requests(
    engine: Engine,
    prompts: Sequence[list[int]],
    mode: str,
    *,
    primer: list[int] | None = None,
    max_tokens: int = 1,
    warmup: int = 2,
    repeats: int = 7,
) -> dict:
    """Time ``prompts`` submitted together until every one has ``max_tokens`` tokens (``max_tokens=1``: the
    time to the last first token, a batch's TTFT), with the cache ``mode`` (see the module docstring).

    Returns the ``Timing`` fields (ms), the tokens the engine computed per repeat (``computed_tokens``), the
    engine steps' median wall time (``step_ms``) and the prompt tokens served from the cache per repeat.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    counter = StepCounter(engine)
    computed, steps, hits = [], [], []

    def prepare():
        engine.set_prefix_caching(mode == "cached")  # an empty cache (or none) before every repeat
        if mode == "cached" and primer is not None:
            run_requests(engine, [primer])
        counter.reset()
        counter.active = True

    def run():
        run_requests(engine, prompts, max_tokens)
        counter.active = False
        computed.append(counter.tokens)
        steps.append(counter.step_s * 1e3)
        hits.append(engine.stats().get("prefix_hit_tokens", 0))  # the primer ran alone on an empty cache: no hits

    try:
        t = time_fn(run, warmup=warmup, repeats=repeats, device=engine.device, before_each=prepare)
    finally:
        engine.on_step = None
    n = repeats  # the last ``repeats`` entries are the timed ones
    return {
        **t.as_row(),
        "computed_tokens": int(np.median(computed[-n:])),
        "step_ms": float(np.median(steps[-n:])),
        "cached_tokens": int(np.median(hits[-n:])),
    }


def recover(engine: Engine) -> None:
    """After a failed point (e.g. out of memory mid-step): abort whatever is in flight, so the next point
    starts from an idle engine, and give cached CUDA memory back."""
    for seq in list(engine.scheduler.waiting) + list(engine.scheduler.running):
        engine.abort(seq)
    engine.on_step = None
    if engine.device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def failure_status(e: BaseException) -> str:
    """A short status for a failed point: ``oom`` for out of memory, else the error."""
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "oom"
    return f"error: {type(e).__name__}: {e}"[:300]
