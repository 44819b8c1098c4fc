"""Taking a built server's heap out of the garbage collector's view, so that no full collection walks it mid-run.

CPython's collector walks every tracked object in a full (generation-2) collection, and it runs one whenever enough
new objects outlive the younger generations, at a moment nothing here chooses. A warm engine's heap is large: a
full collection of a tiny engine's already takes 176 ms (394k objects; 239 ms and 544k with compile on) on this
project's CPU, and on the H200 three ordinary Study 1 steps were held 381-531 ms on the host, one of them enough to
split F1.2's repeats (``data/dev/analysis/study1_host_stalls.md``). ``gc.freeze()`` moves every object alive now
to a permanent generation that no collection visits; objects made later are collected as before. vLLM does the
same once its server is up (``freeze_gc_heap``).
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect what is garbage already, then freeze the rest; the number of objects frozen (all so far)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
