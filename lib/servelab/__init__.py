"""servelab: measure what it costs to serve a large language model on one GPU.

The tree is the architecture:

- ``measure``   timing, device record, measured ceilings, roofline, kernel profiles
- ``models``    model loading (hub id, local directory, ``config:<name>``) and model shapes
- ``hf_modes``  execution modes of the Hugging Face forward (eager, CUDA graph)
- ``costs``     Study 2: prefill/decode sweeps, the fitted cost model, verdicts
- ``results``   tidy CSVs, sidecars and ``findings.csv`` under ``data/results``
- ``profiles``  notebook profiles (full / smoke) and parameter validation
- ``book``      pieces of the book generated from data (the findings table)
"""

__version__ = "0.1.0"
