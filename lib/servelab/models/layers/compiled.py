"""One ``torch.compile`` wrapper per function for the whole process.

Dynamo keeps its compiled code on the function's code object and guards each entry on the compile
call that made it, so every engine that compiled its blocks afresh would add entries until the
recompile limit (8 by default) is hit, after which Dynamo silently runs the function uncompiled.
Sharing one wrapper lets every engine (every model of a family) reuse the same entries; they differ
only by dtype and by the batch-size-1 specialisation.
"""

from __future__ import annotations

import torch

_WRAPPERS: dict = {}
RECOMPILE_LIMIT = 32  # dtypes × families × (T = 1, T dynamic) × (first block, others), with room to spare


def compiled(fn, **compile_kw):
    """``torch.compile(fn, dynamic=True, fullgraph=True, **compile_kw)``, created once per (fn, options)."""
    kw = {"dynamic": True, "fullgraph": True, **compile_kw}
    key = (fn, tuple(sorted(kw.items())))
    if key not in _WRAPPERS:
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
        _WRAPPERS[key] = torch.compile(fn, **kw)
    return _WRAPPERS[key]
