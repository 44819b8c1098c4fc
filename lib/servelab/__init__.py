"""servelab: measure what it costs to serve a large language model on one GPU.

The tree is the architecture. The system, what a user runs (none of it imports a study):

- ``models``   model loading (hub id, local directory, GGUF, ``config:<name>``), shapes, the engine's model code
- ``kernels``  attention over a paged KV cache: PyTorch references and the Triton kernels; fused small linears
- ``kv``       the paged KV cache: block manager, pool, prefix cache, compaction
- ``engine``   the continuous-batching engine: scheduler and its policies, model runner, CUDA graphs, sampling,
  and its speculative mode (``engine.speculative_engine``: what the server serves and Studies 3 and 6 measure)
- ``speculative`` the speculative mode's pieces (batched verification, prompt lookup, γ, controlled acceptance,
  counters) and Leviathan's analytical model
- ``server``   the OpenAI-compatible HTTP server
- ``loadgen``  the streaming load generator and vLLM's serving metrics
- ``sim``      the discrete-event serving simulator and its cost models
- ``measure``  timing, device record, ceilings, roofline, kernel profiles, result files
- ``bench``    the engine's benchmark (``python -m servelab.bench``) and the HF execution modes it compares with

``studies`` holds the seven studies of the book (and the simulator's validation), on one shared scaffold.
"""

__version__ = "0.1.0"
