"""The paged KV cache: a block manager (pure Python), a preallocated pool, and compaction.

The engine writes K/V through slot mappings and reads through block tables; the scheduler asks the block
manager whether a request fits and is told ``OutOfBlocks`` when it does not.
"""

from servelab.kv.block_manager import BlockManager, OutOfBlocks
from servelab.kv.pool import KVPool
from servelab.kv.compaction import CompactionPlan, compact, plan_compaction

__all__ = ["BlockManager", "OutOfBlocks", "KVPool", "CompactionPlan", "compact", "plan_compaction"]
