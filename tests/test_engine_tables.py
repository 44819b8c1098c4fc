"""Device block tables and decode-graph buckets (CPU; the same code feeds the CUDA graphs)."""

import pytest
import torch

from servelab.engine.block_tables import DeviceBlockTables
from servelab.engine.cuda_graphs import DecodeGraphs, power_of_two_buckets
from servelab.kv import BlockManager, KVPool


def test_rows_follow_the_block_manager_and_refresh_only_on_new_blocks():
    bm = BlockManager(32, 4)
    tables = DeviceBlockTables(bm, rows=2, max_blocks=8, pad_block=31, device="cpu")
    bm.allocate("a", 4)
    bm.allocate("b", 2)
    bm.append("a", 1)  # position 4 opens a's second block
    rows = tables.rows_for(["a", "b"], [4, 1], [bm.slot_mapping("a", 4, 5)[0], bm.slot_mapping("b", 1, 2)[0]])
    got = tables.gather(rows, 2)
    assert got.tolist() == [bm.block_table("a"), bm.block_table("b") + [31]]
    before = tables.host.clone()
    bm.free("b")
    bm.allocate("c", 1)  # c gets the block b gave back
    tables.release("b")
    rows2 = tables.rows_for(["a", "c"], [4, 0], [bm.slot_mapping("a", 4, 5)[0], bm.slot_mapping("c", 0, 1)[0]])
    assert rows2[0] == rows[0] and torch.equal(tables.host[rows[0]], before[rows[0]])  # a: no refresh needed
    assert tables.gather(rows2, 2).tolist()[1][0] == bm.block_table("c")[0]


def test_pad_row_holds_only_the_pad_block_and_rows_run_out_loudly():
    bm = BlockManager(8, 4)
    tables = DeviceBlockTables(bm, rows=1, max_blocks=2, pad_block=7, device="cpu")
    assert tables.device_table[tables.pad_row].tolist() == [7, 7]
    bm.allocate(1, 1)
    bm.allocate(2, 1)
    tables.rows_for([1], [0], [bm.slot_mapping(1, 0, 1)[0]])
    with pytest.raises(RuntimeError, match="no free block-table row"):
        tables.rows_for([2], [0], [bm.slot_mapping(2, 0, 1)[0]])


def test_buckets_pick_the_smallest_capture_that_holds_a_step():
    assert power_of_two_buckets(20, smallest=8) == [8, 16, 20]
    assert power_of_two_buckets(1) == [1]
    pool = KVPool(1, 9, 4, 1, 8, torch.float32)
    bm = BlockManager(8, 4)
    graphs = DecodeGraphs(
        None, pool, DeviceBlockTables(bm, 6, 5, 8, "cpu"), max_batch=6, scratch_block=8, block_widths=[2, 5]
    )
    assert graphs.batch_sizes == [1, 2, 4, 6]
    assert graphs.bucket(3, 1) == (4, 2) and graphs.bucket(6, 3) == (6, 5)
    assert graphs.bucket(7, 1) is None and graphs.bucket(1, 6) is None
    host = graphs.pack([11, 12], [3, 9], [40, 41], [0, 1], batch=4)
    assert host.tolist() == [[11, 12, 0, 0], [3, 9, 0, 0], [40, 41, 32, 32], [4, 10, 1, 1], [0, 1, 6, 6]]
