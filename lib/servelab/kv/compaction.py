"""Compaction: move live KV blocks into a contiguous prefix of the pool and rewrite the block tables.

After requests of mixed lengths come and go, live blocks are scattered over the pool. Compaction plans the
fewest moves that make them a prefix (every live block beyond the prefix goes into a hole inside it), copies
those blocks in every layer, K and V, and then tells the ``BlockManager`` (``relocate``).

Three data movers, compared in Study 4:

- ``gather_scatter``: one ``index_select`` of all source blocks into a temporary, one ``index_copy_`` into the
  destinations: two kernels whatever the number of blocks (the temporary doubles the bytes that cross HBM). PyTorch's
  index kernels move one element per thread, so a 2-byte dtype moves 2 bytes per thread;
- ``gather_scatter_wide``: the same two kernels on the pool's bytes viewed as 64-bit words (compaction moves bytes,
  not numbers): 4× fewer, wider elements for bf16/fp16;
- ``block_loop``: one strided copy per block: the naive version, one kernel launch per block moved.

Any of them can run on a CUDA stream of its own, so that it may overlap decode on the default stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.kv.block_manager import BlockManager


@dataclass(frozen=True)
class CompactionPlan:
    """Moves ``src[i] → dst[i]`` that leave the ``live`` used blocks as the prefix ``0 … live-1``."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    live: int
    num_blocks: int

    @property
    def moved(self) -> int:
        return len(self.src)

    @property
    def fraction_moved(self) -> float:
        """Moved blocks over live blocks (0 when nothing is live)."""
        return self.moved / self.live if self.live else 0.0


def plan_compaction(manager: BlockManager) -> CompactionPlan:
    """The fewest block moves that make the live blocks a contiguous prefix of the pool."""
    live = manager.live_blocks()
    n = len(live)
    movers = [b for b in live if b >= n]
    holes = [b for b in range(n) if manager.ref_count(b) == 0]
    assert len(movers) == len(holes)  # n live blocks: each one outside the prefix leaves one hole inside it
    return CompactionPlan(tuple(movers), tuple(holes), n, manager.num_blocks)


def block_index(pool, blocks):
    """Block ids as a LongTensor on the pool's device (copied asynchronously from pinned memory on CUDA)."""
    import torch

    idx = torch.tensor(list(blocks), dtype=torch.long)
    if pool.device.type == "cuda":
        return idx.pin_memory().to(pool.device, non_blocking=True)
    return idx.to(pool.device)


def move_gather_scatter(pool, src_idx, dst_idx) -> None:
    """Copy blocks ``src_idx → dst_idx`` (LongTensors on the pool's device) in all layers, K and V: 2 kernels."""
    pool.kv.index_copy_(2, dst_idx, pool.kv.index_select(2, src_idx))


def wide_view(kv):
    """``kv`` viewed as 64-bit words along its last dimension when its bytes allow it (else ``kv`` itself)."""
    import torch

    if kv.is_contiguous() and (kv.shape[-1] * kv.element_size()) % 8 == 0 and kv.element_size() < 8:
        return kv.view(torch.int64)
    return kv


def move_gather_scatter_wide(pool, src_idx, dst_idx) -> None:
    """``move_gather_scatter`` on the pool's bytes as 64-bit words: the same 2 kernels, 8 bytes per element."""
    kv = wide_view(pool.kv)
    kv.index_copy_(2, dst_idx, kv.index_select(2, src_idx))


def move_block_loop(pool, src, dst) -> None:
    """Copy blocks ``src[i] → dst[i]`` (Python ints) one strided copy per block: ``len(src)`` kernels."""
    kv = pool.kv
    for s, d in zip(src, dst, strict=True):
        kv[:, :, d].copy_(kv[:, :, s])


MOVERS = ("gather_scatter", "gather_scatter_wide", "block_loop")


def move_blocks(pool, src, dst, method: str = "gather_scatter") -> None:
    """Copy blocks with the named mover; ``src``/``dst`` are sequences of block ids."""
    if method not in MOVERS:
        raise ValueError(f"method must be one of {MOVERS}, got {method!r}")
    if len(src) != len(dst):
        raise ValueError(f"src and dst must have equal length, got {len(src)} and {len(dst)}")
    if not len(src):
        return
    if method == "block_loop":
        move_block_loop(pool, list(src), list(dst))
    else:
        move = move_gather_scatter if method == "gather_scatter" else move_gather_scatter_wide
        move(pool, block_index(pool, src), block_index(pool, dst))


def compact(pool, manager: BlockManager, method: str = "gather_scatter", stream=None) -> CompactionPlan:
    """Compact ``pool`` and rewrite ``manager``'s block tables; return the plan that was carried out.

    With a CUDA ``stream`` the copies are queued on it after everything already queued on the current stream
    (so the K/V being moved are complete), and this returns at once. The block tables are rewritten immediately
    and the source blocks are free again, so before the next read *or write* of the pool on another stream
    (a new sequence may be given a source block), wait for it: ``torch.cuda.current_stream().wait_stream(stream)``.
    """
    import contextlib

    import torch

    if pool.num_blocks != manager.num_blocks or pool.block_size != manager.block_size:
        raise ValueError(
            f"pool ({pool.num_blocks} blocks of {pool.block_size}) and manager "
            f"({manager.num_blocks} of {manager.block_size}) describe different pools"
        )
    if stream is not None and pool.device.type != "cuda":
        raise ValueError("a stream only makes sense for a pool on a CUDA device")
    plan = plan_compaction(manager)
    ctx = contextlib.nullcontext()
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(pool.device))
        ctx = torch.cuda.stream(stream)
    with ctx:  # index tensors and the gather temporary are allocated on the stream that uses them
        move_blocks(pool, plan.src, plan.dst, method)
    manager.relocate(plan.src, plan.dst)
    return plan
