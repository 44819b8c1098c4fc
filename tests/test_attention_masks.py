"""Masks, shapes and the reference: FLOP counts agree with the masks they count."""

import math

import pytest
import torch

from servelab.studies.s05_attention.masks import Mask, ragged_documents
from servelab.studies.s05_attention.reference import check_rows, reference_attention, relative_error, tolerance
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape

MASKS = [
    Mask("none"),
    Mask("causal"),
    Mask("sliding_window", window=5),
    Mask("sliding_window", window=100),
    Mask("document", doc_lengths=(3, 10, 1, 16)),
]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.label)
def test_allowed_pairs_count_the_dense_mask(mask):
    assert mask.allowed_pairs(30, 30) == int(mask.dense(30, 30).sum())


def test_causal_pairs_are_the_causal_half_and_flops_follow():
    arch = Architecture("a", heads=8, kv_heads=2, head_dim=64)
    s = AttentionShape.prefill(arch, 1024)
    assert s.pairs == 1024 * 1025 // 2
    assert s.flops == 4 * 8 * 64 * 1024 * 1025 / 2
    d = AttentionShape.decode(arch, 4096, batch=3)
    assert d.flops == 4 * 3 * 8 * 64 * 4096
    assert d.kv_bytes(2) == 2 * 3 * 4096 * 2 * 64 * 2  # K and V, kv_heads only


def test_document_mask_blocks_attention_across_documents():
    m = Mask("document", doc_lengths=(2, 3))
    dense = m.dense(5, 5)
    assert not dense[2, 1] and dense[4, 2] and not dense[2, 3]


def test_ragged_documents_cover_the_row():
    lengths = ragged_documents(1000, 7, seed=2)
    assert len(lengths) == 7 and sum(lengths) == 1000 and min(lengths) >= 1
    assert len(set(lengths)) > 1
    with pytest.raises(ValueError):
        ragged_documents(3, 5)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="diagonal"),
        dict(kind="sliding_window"),
        dict(kind="sliding_window", window=0),
        dict(kind="document", doc_lengths=()),
    ],
)
def test_bad_masks_are_rejected(kwargs):
    with pytest.raises(ValueError):
        Mask(**kwargs)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="multiple"):
        Architecture("x", heads=6, kv_heads=4, head_dim=8)
    arch = Architecture("x", heads=4, kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="q_len == kv_len"):
        AttentionShape(arch, 1, 4, 8, Mask("causal"))
    with pytest.raises(ValueError, match="sum"):
        AttentionShape.prefill(arch, 10, mask=Mask("document", doc_lengths=(4, 4)))


def test_architecture_from_shipped_config():
    a = Architecture.from_model("qwen2-1.5b")
    assert (a.heads, a.kv_heads, a.head_dim, a.group) == (12, 2, 128, 6)
    assert Architecture.from_model("llama-3-8b", head_dim=64).head_dim == 64
    with pytest.raises(ValueError, match="no shipped config"):
        Architecture.from_model("gpt5")


def test_reference_matches_a_direct_float64_computation():
    arch = Architecture("a", heads=4, kv_heads=2, head_dim=8)
    s = AttentionShape.prefill(arch, 40)
    q, k, v = s.random_inputs(torch.float64, "cpu")
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ kk.transpose(-1, -2) / math.sqrt(8) + torch.full((40, 40), float("-inf")).triu(1)
    direct = torch.softmax(scores, -1) @ vv
    rows = check_rows(40, max_rows=10)
    assert torch.allclose(reference_attention(q, k, v, s.mask, rows), direct[:, :, rows])


def test_check_rows_keep_both_ends_and_relative_error_flags_nan():
    rows = check_rows(10_000, max_rows=50)
    assert len(rows) == 50 and rows[0] == 0 and rows[-1] == 9_999 and len(set(rows.tolist())) == 50
    ref = torch.ones(2, 3, dtype=torch.float64)
    assert relative_error(ref.float(), ref) == 0
    assert relative_error(torch.full((2, 3), float("nan")), ref) == math.inf
    with pytest.raises(ValueError, match="tolerance"):
        tolerance(torch.int8)
