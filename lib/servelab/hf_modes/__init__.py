"""Execution modes of the Hugging Face forward, each returning a timed callable for one step.

A *step* is one forward of ``new_tokens`` tokens for each of ``batch`` sequences that already hold
``context`` cached tokens: decode is ``new_tokens=1``; prefill is ``context=0``.

- ``eager``:      HF forward with its own ``DynamicCache``; what ``generate()`` does by default.
- ``cuda_graph``: HF forward with a ``StaticCache``, captured once in a CUDA graph and replayed.
- the project's own engine joins here as a third mode (the engine issue).
"""

from servelab.hf_modes.eager import eager_step
from servelab.hf_modes.cuda_graph import cuda_graph_step

MODES = {"hf_eager": eager_step, "hf_cuda_graph": cuda_graph_step}

__all__ = ["MODES", "eager_step", "cuda_graph_step"]
