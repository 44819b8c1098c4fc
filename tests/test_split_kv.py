"""Split-KV decode: how many splits a step gets, and the log-sum-exp merge (PyTorch; the Triton kernels are
checked against the same results under the interpreter in test_engine_triton.py)."""

import pytest
import torch

from servelab.kernels.decode import gather_decode
from servelab.kernels.split_kv import (
    MAX_SPLITS,
    MIN_SPLIT_KEYS,
    decode_splits,
    head_pad,
    merge_partials,
    single_pass_blocks,
    split_decode_reference,
    split_ranges,
)


def test_splits_fill_the_gpu_at_small_batch_and_long_context():
    # batch 1, Qwen2-0.5B's 2 KV heads, 16K keys on 132 SMs: 264 programs wanted, 64 allowed
    assert decode_splits(1, 2, 16384, 132) == MAX_SPLITS
    # batch 64 x 2 KV heads = 128 programs already: 3 splits make 384 >= 264
    assert decode_splits(64, 2, 4096, 132) == 3
    # a batch that fills the GPU on its own is not split
    assert decode_splits(256, 2, 16384, 132) == 1
    # each split keeps at least MIN_SPLIT_KEYS keys of the longest context
    assert decode_splits(1, 2, 4 * MIN_SPLIT_KEYS, 132) == 4
    assert decode_splits(1, 2, 2 * MIN_SPLIT_KEYS - 1, 132) == 1
    assert decode_splits(1, 2, 16384, None) == decode_splits(1, 2, 16384, 132)  # no device: an H200
    with pytest.raises(ValueError, match="batch"):
        decode_splits(0, 2, 128)


def test_a_single_pass_width_never_splits():
    for block_size in (4, 16, 32):
        keys = single_pass_blocks(block_size) * block_size
        assert decode_splits(1, 1, keys, 132) == 1
        assert decode_splits(1, 1, keys + 2 * block_size, 132) > 1  # the next width up does split


def test_split_ranges_cover_the_context_once_in_whole_tiles():
    for length in (1, 63, 64, 65, 300, 1000, 4097):
        for splits in (1, 2, 3, 7):
            ranges = split_ranges(length, splits, keys=64, min_keys=64)
            covered = [p for lo, hi in ranges for p in range(lo, hi)]
            assert covered == list(range(length)), (length, splits)
            assert all(lo % 64 == 0 for lo, _ in ranges)
    assert split_ranges(100, 4, keys=16, min_keys=256) == [(0, 100), (256, 100), (512, 100), (768, 100)]


def test_head_pad_is_the_next_power_of_two_at_least_16():
    assert [head_pad(d) for d in (8, 16, 64, 80, 96, 112, 128, 256)] == [16, 16, 64, 128, 128, 128, 128, 256]
    with pytest.raises(ValueError):
        head_pad(0)


def test_merge_ignores_empty_splits_and_equals_one_softmax():
    g = torch.Generator().manual_seed(0)
    scores, v = torch.randn(3, 50, generator=g), torch.randn(50, 8, generator=g)
    whole = scores.softmax(-1) @ v
    cuts = [(0, 20), (20, 45), (45, 50), (50, 50)]
    part = torch.stack(
        [scores[:, lo:hi].softmax(-1) @ v[lo:hi] if hi > lo else torch.zeros(3, 8) for lo, hi in cuts], 1
    )
    lse = torch.stack(
        [scores[:, lo:hi].logsumexp(-1) if hi > lo else torch.full((3,), float("-inf")) for lo, hi in cuts], 1
    )
    torch.testing.assert_close(merge_partials(part, lse), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("heads,kv_heads,d,bs", [(4, 1, 80, 8), (6, 2, 96, 16), (2, 2, 64, 4)])
def test_split_reference_equals_decode_attention(heads, kv_heads, d, bs):
    g = torch.Generator().manual_seed(1)
    kp = torch.randn(80, bs, kv_heads, d, generator=g)
    vp = torch.randn_like(kp)
    lens = torch.tensor([1, 17, 70, 301])  # none a multiple of the 16-key chunk
    width = max(-(-n // bs) for n in lens.tolist())
    tables = torch.stack([torch.randperm(80, generator=g)[:width] for _ in lens])
    q = torch.randn(4, heads, d, generator=g)
    ref = gather_decode(q, kp, vp, tables, lens, d**-0.5)
    for splits in (1, 3, 5):
        got = split_decode_reference(q, kp, vp, tables, lens, d**-0.5, splits, keys=16, min_keys=16)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
