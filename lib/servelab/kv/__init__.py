"""The paged KV cache the engine runs on.

- ``block_manager``: which blocks each sequence owns (pure Python: the scheduler and the simulator use it);
- ``pool``: one preallocated tensor holding every layer's K and V in fixed-size blocks;
- ``prefix_cache``: automatic prefix caching, full blocks indexed by their whole prefix, LRU/LFU eviction;
- ``compaction``: move live blocks into a contiguous prefix of the pool and rewrite the block tables.

The engine writes K/V through slot mappings and reads through block tables; the scheduler asks the block manager
whether a request fits and is told ``OutOfBlocks`` when it does not.
"""

from servelab.kv.block_manager import BlockManager, OutOfBlocks
from servelab.kv.compaction import CompactionPlan, compact, plan_compaction
from servelab.kv.pool import KVPool

__all__ = ["BlockManager", "OutOfBlocks", "KVPool", "CompactionPlan", "compact", "plan_compaction"]
