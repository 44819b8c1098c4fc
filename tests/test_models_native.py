"""The project's own model code against Hugging Face's, on the same weights, in float32 on the CPU."""

import pytest
import torch

from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.decode import gather_decode
from servelab.kernels.prefill import PrefillSegment
from servelab.kv import BlockManager, KVPool
from servelab.models import load_model
from servelab.models.layers.rotary import RotaryEmbedding
from servelab.models.native import native_from_hf, native_model_class

FAMILIES = ["tiny-qwen2", "tiny-llama", "tiny-gpt2"]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    hf = load_model(f"config:{request.param}").model
    return hf, native_from_hf(hf, max_positions=256)


def _prefill_meta(bm, seq, start, end):
    table = torch.tensor(bm.block_table(seq))
    return AttentionMetadata(
        slot_mapping=torch.tensor(bm.slot_mapping(seq, start, end)),
        prefills=[PrefillSegment(0, end - start, start, table if start else None)],
    )


def _pool(model, blocks=32, block_size=4):
    pool = KVPool.for_model(model.shape, blocks, block_size, torch.float32)
    pool.kv.zero_()
    return pool, BlockManager(blocks, block_size)


@torch.inference_mode()
def test_prefill_logits_match_hf(pair):
    hf, ours = pair
    ids = torch.randint(0, ours.shape.vocab, (13,), generator=torch.Generator().manual_seed(1))
    pool, bm = _pool(ours)
    bm.allocate("s", 13)
    got = ours(ids, torch.arange(13), _prefill_meta(bm, "s", 0, 13), pool)
    ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_prefill_in_chunks_over_cached_context_matches_one_prefill(pair):
    hf, ours = pair
    ids = torch.randint(0, ours.shape.vocab, (13,), generator=torch.Generator().manual_seed(2))
    pool, bm = _pool(ours)
    bm.allocate("s", 13)
    parts = [
        ours(ids[a:b], torch.arange(a, b), _prefill_meta(bm, "s", a, b), pool) for a, b in ((0, 5), (5, 6), (6, 13))
    ]
    torch.testing.assert_close(torch.cat(parts), hf(ids[None]).logits[0], rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_batched_decode_matches_the_reference_path(pair):
    """Three sequences of different lengths decode one token each: gather backend == per-sequence reference."""
    _, ours = pair
    pool, bm = _pool(ours, blocks=40)
    g = torch.Generator().manual_seed(3)
    lens = [3, 9, 17]
    for i, n in enumerate(lens):  # fill each sequence's cache with a real prefill
        bm.allocate(i, n)
        ours(torch.randint(0, ours.shape.vocab, (n,), generator=g), torch.arange(n), _prefill_meta(bm, i, 0, n), pool)
    slots = [bm.append(i, 1)[0] for i in range(3)]
    width = max(len(bm.block_table(i)) for i in range(3))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        num_decode_tokens=3,
        decode_context_lens=torch.tensor([n + 1 for n in lens]),
        decode_block_tables=torch.tensor(
            [bm.block_table(i) + [0] * (width - len(bm.block_table(i))) for i in range(3)]
        ),
    )
    ids, pos = torch.randint(0, ours.shape.vocab, (3,), generator=g), torch.tensor(lens)
    batched = ours(ids, pos, meta, pool)
    for block in ours.layers:
        block.attn.backend = "reference"
    try:
        reference = ours(ids, pos, meta, pool)
    finally:
        for block in ours.layers:
            block.attn.backend = "gather"
    torch.testing.assert_close(batched, reference, rtol=1e-5, atol=1e-5)


def test_gather_decode_ignores_keys_past_each_length():
    g = torch.Generator().manual_seed(4)
    k = torch.randn(6, 4, 2, 8, generator=g)
    v = torch.randn(6, 4, 2, 8, generator=g)
    q = torch.randn(1, 4, 8, generator=g)
    table = torch.tensor([[2, 5]])
    out = gather_decode(q, k, v, table, torch.tensor([3]), 8**-0.5)
    k2, v2 = k.clone(), v.clone()
    k2[2, 3:], v2[2, 3:], k2[5], v2[5] = 1e4, 1e4, 1e4, 1e4  # everything past length 3 changes
    torch.testing.assert_close(gather_decode(q, k2, v2, table, torch.tensor([3]), 8**-0.5), out)


def test_rope_tables_equal_hf_rotary_embedding():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    cfg = load_model("config:tiny-qwen2").model.config
    ours = RotaryEmbedding(cfg, 64)
    pos = torch.tensor([[0, 1, 7, 63]])
    cos, sin = Qwen2RotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), pos)
    c, s = ours(pos[0], torch.float32)
    torch.testing.assert_close(c[:, 0], cos[0], rtol=0, atol=0)
    torch.testing.assert_close(s[:, 0], sin[0], rtol=0, atol=0)


def test_tied_and_untied_lm_heads_load_correctly():
    tied = native_from_hf(load_model("config:tiny-qwen2").model)
    assert tied.lm_head.weight is tied.embed.weight
    hf = load_model("config:tiny-llama").model
    untied = native_from_hf(hf)
    assert untied.lm_head.weight is not untied.embed.weight
    torch.testing.assert_close(untied.lm_head.weight, hf.lm_head.weight)


def test_unsupported_architectures_are_refused_clearly():
    cfg = load_model("config:tiny-llama").model.config
    cfg.hidden_act = "gelu"
    with pytest.raises(NotImplementedError, match="silu"):
        native_model_class(cfg)(cfg)

    class Bert:
        model_type = "bert"

    with pytest.raises(NotImplementedError, match="bert"):
        native_model_class(Bert())
