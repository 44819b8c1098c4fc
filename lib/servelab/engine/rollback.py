"""Rejected drafts give their KV back: a sequence's blocks past its computed tokens return to the block manager.

A speculative step reserves slots for a sequence's pending token and its γ drafts; when the target keeps only some of
the drafts, the positions after them hold K/V of tokens that will never be part of the sequence. They are not erased
(a rollback moves no bytes: the next tokens overwrite them), but every whole block past the last kept position goes
back (``BlockManager.truncate``), so a step that rejects drafts holds no more blocks than one that never drafted.
"""

from __future__ import annotations

import time

from servelab.engine.block_tables import DeviceBlockTables
from servelab.engine.sequence import Sequence
from servelab.kv.block_manager import BlockManager


def give_back_tail(bm: BlockManager, tables: DeviceBlockTables, seq: Sequence) -> list[int]:
    """Free ``seq``'s blocks past the block holding its last computed position (reservations are whole blocks, as
    ``Scheduler.reserve_slots`` makes them); its slots are cut to match. Returns the blocks freed."""
    bs = bm.block_size
    keep = -(-seq.num_computed_tokens // bs) * bs
    if keep >= len(seq.kv_slots) or seq.seq_id not in bm:
        return []
    freed = bm.truncate(seq.seq_id, keep)
    seq.kv_slots = seq.kv_slots[:keep]
    # the device row may list the freed blocks; a block handed out again at the same index would look unchanged to
    # ``rows_for`` (it compares one index), so the row is rebuilt whole the next time the sequence decodes
    row = tables.row_of.get(seq.seq_id)
    if row is not None:
        tables.known[row] = []
    return freed


def timed_give_back(engine, seq: Sequence, dropped: int) -> float:
    """Host seconds of one rollback of ``dropped`` rejected drafts: ``seq``'s slots are reserved ``dropped`` past its
    computed tokens (as a speculative step reserves its drafts'), untimed, and the give-back is timed. For the cost
    of a rollback in Study 3; a study reaches the block manager only through here."""
    if not engine.scheduler.reserve(seq, seq.num_computed_tokens + dropped):
        raise RuntimeError(f"no free blocks for {dropped} more slots of sequence {seq.seq_id}")
    t0 = time.perf_counter()
    give_back_tail(engine.block_manager, engine.runner.tables, seq)
    return time.perf_counter() - t0
