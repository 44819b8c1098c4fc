"""Execution modes of the Hugging Face forward, each returning a timed callable for one step.

A *step* is one forward of ``new_tokens`` tokens for each of ``batch`` sequences that already hold
``context`` cached tokens: decode is ``new_tokens=1``; prefill is ``context=0``.

- ``eager``:      HF forward with its own ``DynamicCache``; what ``generate()`` does by default.
- ``cuda_graph``: HF forward with a ``StaticCache``, captured once in a CUDA graph and replayed.
- ``engine``:     the project's own engine forward (paged KV cache, CUDA-graph decode), for comparison.
"""

from servelab.hf_modes.eager import eager_step
from servelab.hf_modes.cuda_graph import cuda_graph_step



def engine_step(model, batch: int, new_tokens: int, context: int, **kw):
    """The engine's step on the same HF model's weights; imported lazily (the engine pulls in much more)."""
    from servelab.engine.bench.step import engine_step as step

    return step(model, batch, new_tokens, context, **kw)


MODES = {"hf_eager": eager_step, "hf_cuda_graph": cuda_graph_step, "engine": engine_step}

__all__ = ["MODES", "eager_step", "cuda_graph_step", "engine_step"]
