"""KVPool: sizes match the formula, writes land in the right slots, gather reads them back."""

import pytest
import torch

from servelab.kv import BlockManager, KVPool
from servelab.models.shape import ModelShape

QWEN05 = ModelShape("llama", 24, 896, 14, 2, 64, 4864, 151936, 0, True, True)


def test_pool_bytes_equal_formula():
    pool = KVPool.for_model(QWEN05, num_blocks=3, block_size=16, dtype=torch.float16)
    assert pool.bytes_per_token == QWEN05.kv_bytes_per_token(2) == 2 * 24 * 2 * 64 * 2
    assert pool.bytes_per_block == 16 * pool.bytes_per_token
    assert pool.nbytes == 3 * pool.bytes_per_block
    assert tuple(pool.k[5].shape) == (3, 16, 2, 64)


def test_from_memory_sizes_by_budget():
    per_block = KVPool.block_bytes(QWEN05, 16, "bfloat16")
    pool = KVPool.from_memory(QWEN05, bytes_budget=5 * per_block + 7, block_size=16, dtype="bfloat16")
    assert pool.num_blocks == 5 and pool.nbytes <= 5 * per_block + 7
    with pytest.raises(ValueError, match="holds no block"):
        KVPool.from_memory(QWEN05, bytes_budget=per_block - 1, block_size=16)
    with pytest.raises(ValueError):
        KVPool.from_memory(QWEN05, bytes_budget=-1, block_size=16)
    with pytest.raises(ValueError, match="unknown dtype"):
        KVPool.for_model(QWEN05, 1, 16, dtype="int3")


def test_write_then_gather_roundtrip_through_block_manager():
    g = torch.Generator().manual_seed(0)
    bm = BlockManager(num_blocks=12, block_size=4)
    pool = KVPool(layers=2, num_blocks=12, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32)
    pool.fill_random(g)
    bm.allocate("filler", 4)
    bm.allocate("s", 3)
    ref_k, ref_v = torch.randn(11, 2, 8, generator=g), torch.randn(11, 2, 8, generator=g)
    for layer in range(2):
        pool.write(layer, torch.tensor(bm.slot_mapping("s", 0, 3)), ref_k[:3] + layer, ref_v[:3] - layer)
    slots = torch.tensor(bm.append("s", 8))
    for layer in range(2):
        pool.write(layer, slots, ref_k[3:] + layer, ref_v[3:] - layer)
    for layer in range(2):
        k, v = pool.gather(layer, torch.tensor(bm.block_table("s")), bm.num_tokens("s"))
        assert torch.equal(k, ref_k + layer) and torch.equal(v, ref_v - layer)


def test_write_rejects_wrong_shapes():
    pool = KVPool(1, 2, 4, 2, 8, dtype=torch.float32)
    with pytest.raises(ValueError):
        pool.write(0, torch.tensor([0, 1]), torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    with pytest.raises(ValueError):
        pool.gather(0, torch.tensor([0]), 5)


def test_copy_blocks_copies_all_layers():
    pool = KVPool(3, 4, 2, 1, 4, dtype=torch.float32).fill_random(torch.Generator().manual_seed(1))
    pool.copy_blocks([(0, 3), (1, 2)])
    assert torch.equal(pool.kv[:, :, 3], pool.kv[:, :, 0]) and torch.equal(pool.kv[:, :, 2], pool.kv[:, :, 1])
