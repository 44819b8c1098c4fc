"""The paged KV cache, and Study 4's measurements of what a KV cache costs.

The cache (what the engine runs on):

- ``block_manager``: which blocks each sequence owns (pure Python: the scheduler and the simulator use it);
- ``pool``: one preallocated tensor holding every layer's K and V in fixed-size blocks;
- ``compaction``: move live blocks into a contiguous prefix of the pool and rewrite the block tables.

The engine writes K/V through slot mappings and reads through block tables; the scheduler asks the block manager
whether a request fits and is told ``OutOfBlocks`` when it does not.

Study 4 (``notebooks/04_kv_cache.ipynb``): ``bytes_per_token`` (F4.1), ``capacity``, ``decode_scaling`` (F4.2),
``compaction_bench`` (F4.3), ``overlap`` and ``overlap_probes`` (F4.4), ``verdicts``, ``plots``, ``params``.
"""

from servelab.kv.block_manager import BlockManager, OutOfBlocks
from servelab.kv.pool import KVPool
from servelab.kv.compaction import CompactionPlan, compact, plan_compaction

__all__ = ["BlockManager", "OutOfBlocks", "KVPool", "CompactionPlan", "compact", "plan_compaction"]
