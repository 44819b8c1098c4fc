"""Block tables as a device tensor, kept up to date incrementally.

Building a ``[batch, max_blocks]`` tensor from Python lists every decode step costs milliseconds at
batch 256 (tens of thousands of ints converted), more than the GPU step itself. A sequence's table
only grows, one block every ``block_size`` tokens, so each running sequence owns a row of a
persistent table, on the host and on the device; a step re-reads a row from the block manager only
when the block it writes to is not the one the row holds there (a new block, or copy-on-write),
copies the changed rows to the device in one transfer, and gathers the step's rows on the device.
"""

from __future__ import annotations

import torch

from servelab.kv.block_manager import BlockManager


class DeviceBlockTables:
    def __init__(self, bm: BlockManager, rows: int, max_blocks: int, pad_block: int, device):
        """``rows`` sequences at once; one more row, ``pad_row``, always holds only ``pad_block``."""
        self.bm, self.max_blocks, self.pad_block = bm, max_blocks, pad_block
        rows += 1
        self.pad_row = rows - 1
        self.host = torch.full((rows, max_blocks), pad_block, dtype=torch.long)
        self.device_table = torch.full((rows, max_blocks), pad_block, dtype=torch.long, device=device)
        self.row_of: dict[int, int] = {}
        self.free_rows = list(range(rows - 2, -1, -1))  # pop() hands out low rows first
        self.known: list[list[int]] = [[] for _ in range(rows)]  # the host row's contents, as a list

    def release(self, seq_id) -> None:
        """Forget a finished or preempted sequence (its row is reused)."""
        r = self.row_of.pop(seq_id, None)
        if r is not None:
            self.known[r] = []
            self.free_rows.append(r)

    def rows_for(self, seq_ids: list, positions: list[int], slots: list[int]) -> list[int]:
        """Rows holding each sequence's table, refreshed where the block of ``positions[i]`` is not ``slots[i]``'s."""
        bs = self.bm.block_size
        changed, rows = [], []
        for sid, p, s in zip(seq_ids, positions, slots, strict=True):
            r = self.row_of.get(sid)
            if r is None:
                if not self.free_rows:
                    raise RuntimeError(
                        f"no free block-table row for sequence {sid!r}: more sequences in flight than "
                        "max_num_seqs, or finished ones were not released"
                    )
                r = self.row_of[sid] = self.free_rows.pop()
            known = self.known[r]
            j = p // bs
            if j >= len(known) or known[j] != s // bs:
                table = self.bm.block_table(sid)
                self.known[r] = table
                self.host[r, : len(table)] = torch.tensor(table, dtype=torch.long)
                changed.append(r)
            rows.append(r)
        if changed:
            idx = torch.tensor(changed, dtype=torch.long)
            dev = self.device_table.device  # non-blocking: a blocking copy would wait for the step in flight
            self.device_table.index_copy_(
                0, idx.to(dev, non_blocking=True), self.host.index_select(0, idx).to(dev, non_blocking=True)
            )
        return rows

    def gather(self, rows: list[int], width: int) -> torch.Tensor:
        """The step's tables ``[len(rows), width]`` on the device."""
        idx = torch.tensor(rows, dtype=torch.long).to(self.device_table.device, non_blocking=True)
        return self.device_table[:, :width].index_select(0, idx)
