"""Execution modes of the Hugging Face forward, each returning a timed callable for one step.

A *step* is one forward of ``new_tokens`` tokens for each of ``batch`` sequences that already hold
``context`` cached tokens: decode is ``new_tokens=1``; prefill is ``context=0``; a prefill with ``context > 0``
is a chunk after cached tokens (chunked prefill, a prefix-cache hit).

- ``hf_eager``:      HF forward with its own ``DynamicCache``; what ``generate()`` does by default.
- ``hf_cuda_graph``: HF forward with a ``StaticCache``, captured once in a CUDA graph and replayed.
- ``engine``:        the project's own engine forward (paged KV cache, CUDA graphs for decode and whole steps).
- ``engine_eager``:  the same engine with no CUDA graph: every kernel launched from Python.

Both HF modes run a prefill after context by filling their cache with ``context`` random tokens first. Only the
engine modes (``MIXED_MODES``) run a *mixed* step, decodes and a prefill chunk in one forward (keyword arguments
``decodes`` and ``decode_context``): HF's forward takes one rectangular batch, so it has no such step.
"""

from servelab.bench.hf_modes.cuda_graph import cuda_graph_step
from servelab.bench.hf_modes.eager import eager_step


def engine_step(model, batch: int, new_tokens: int, context: int, **kw):
    """The engine's step on the same HF model's weights; imported lazily (the engine pulls in much more)."""
    from servelab.bench.step import engine_step as step

    return step(model, batch, new_tokens, context, **kw)


def engine_eager_step(model, batch: int, new_tokens: int, context: int, **kw):
    """The engine's step with no CUDA graph (decode or whole-step): what launching each kernel costs."""
    from servelab.bench.step import engine_eager_step as step

    return step(model, batch, new_tokens, context, **kw)


MODES = {
    "hf_eager": eager_step,
    "hf_cuda_graph": cuda_graph_step,
    "engine": engine_step,
    "engine_eager": engine_eager_step,
}
MIXED_MODES = ("engine", "engine_eager")

__all__ = ["MODES", "MIXED_MODES", "eager_step", "cuda_graph_step", "engine_step", "engine_eager_step"]
