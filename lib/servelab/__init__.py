"""servelab: measure what it costs to serve a large language model on one GPU.

The tree is the architecture:

- ``measure``   timing, device record, measured ceilings, roofline, kernel profiles
- ``models``    model loading (hub id, local directory, ``config:<name>``) and model shapes
- ``hf_modes``  execution modes of a step: HF eager, HF in a CUDA graph, the engine with its graphs, the engine launching every kernel (engine_eager)
- ``costs``     Study 2: prefill/decode sweeps, the fitted cost model, verdicts
- ``results``   tidy CSVs, sidecars and ``findings.csv`` under ``data/results``
- ``profiles``  notebook profiles (full / smoke) and parameter validation
- ``kv``        the paged KV cache (block manager, pool, compaction) and Study 4
- ``attention`` Study 5's attention variants behind one call signature
- ``engine``    the continuous-batching inference engine (scheduler, model runner, CUDA graphs)
- ``prefix``    prefix-cache policies (LRU, LFU, radix LRU) under Zipf popularity, and their optimum
- ``book``      pieces of the book generated from data (the findings table)
"""

__version__ = "0.1.0"
