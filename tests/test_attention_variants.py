"""Every attention variant against the float64 reference on the CPU, where its backend exists there."""

import pytest
import torch

from servelab.studies.s05_attention.masks import Mask, ragged_documents
from servelab.studies.s05_attention.reference import reference_attention, relative_error, tolerance
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.variants import VARIANTS, Unavailable, get_variant

GQA = Architecture("gqa", heads=4, kv_heads=2, head_dim=16)
MHA = Architecture("mha", heads=2, kv_heads=2, head_dim=8)
CPU_VARIANTS = [n for n in VARIANTS if n not in ("sdpa_efficient", "sdpa_cudnn")]


def _shapes():
    return {
        "causal-gqa": AttentionShape.prefill(GQA, 96),
        "causal-mha": AttentionShape.prefill(MHA, 64, batch=2),
        "decode-gqa": AttentionShape.decode(GQA, 200, batch=3),
        "sliding": AttentionShape.prefill(GQA, 128, mask=Mask("sliding_window", window=16)),
        "document": AttentionShape.prefill(GQA, 128, mask=Mask("document", doc_lengths=ragged_documents(128, 5))),
        # not a multiple of Flex's 128-token block: its mask_mod is evaluated past the end
        "document-100": AttentionShape.prefill(GQA, 100, mask=Mask("document", doc_lengths=(40, 60))),
    }


@pytest.mark.parametrize("shape_name", list(_shapes()))
@pytest.mark.parametrize("name", CPU_VARIANTS)
def test_variant_matches_float64_reference(name, shape_name):
    shape = _shapes()[shape_name]
    q, k, v = shape.random_inputs(torch.float32, "cpu", seed=3)
    out = get_variant(name).build(shape, "cpu")(q, k, v)
    assert out.shape == q.shape
    ref = reference_attention(q, k, v, shape.mask)
    err = relative_error(out, ref)
    assert err < tolerance(torch.float32), f"{name} on {shape_name}: relative error {err:.2e}"


@pytest.mark.parametrize("name", ["sdpa_efficient", "sdpa_cudnn"])
def test_cuda_only_backends_say_so_on_cpu(name):
    with pytest.raises(Unavailable, match="CUDA"):
        get_variant(name).build(AttentionShape.prefill(GQA, 32), "cpu")


def test_bfloat16_variants_within_bf16_tolerance_but_not_fp32():
    shape = AttentionShape.prefill(GQA, 128)
    q, k, v = shape.random_inputs(torch.bfloat16, "cpu", seed=1)
    ref = reference_attention(q, k, v, shape.mask)
    err = relative_error(get_variant("sdpa_math").build(shape, "cpu")(q, k, v), ref)
    assert tolerance(torch.float32) < err < tolerance(torch.bfloat16)


def test_masked_variants_differ_from_unmasked():
    """The sliding window really removes keys: its output is not the causal one."""
    causal = AttentionShape.prefill(GQA, 128)
    sliding = AttentionShape.prefill(GQA, 128, mask=Mask("sliding_window", window=8))
    q, k, v = causal.random_inputs(torch.float32, "cpu")
    a = get_variant("sdpa_default").build(causal, "cpu")(q, k, v)
    b = get_variant("sdpa_default").build(sliding, "cpu")(q, k, v)
    assert torch.allclose(a[:, :, :8], b[:, :, :8], atol=1e-5)  # first rows see < window keys either way
    assert relative_error(b, a.double()) > 1e-2


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention variant"):
        get_variant("flash3")


def test_forced_backend_refusing_grouped_heads_falls_back_to_repeated_heads(monkeypatch):
    """If a backend refuses enable_gqa, the variant repeats K/V heads, says so, and stays correct."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention

    def picky(q, k, v, *, enable_gqa=False, **kw):
        if enable_gqa:
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", picky)
    shape = AttentionShape.prefill(GQA, 64)
    q, k, v = shape.random_inputs(torch.float32, "cpu")
    attn = get_variant("sdpa_flash").build(shape, "cpu")
    out = attn(q, k, v)
    assert attn.gqa.startswith("repeat_kv") and "refused" in attn.gqa
    assert relative_error(out, reference_attention(q, k, v, shape.mask)) < tolerance(torch.float32)
    assert get_variant("sdpa_repeat_kv").build(shape, "cpu").gqa == "repeat_kv"
    assert get_variant("sdpa_math").build(AttentionShape.prefill(MHA, 16), "cpu").gqa == "mha"


def test_held_backend_is_entered_once_not_per_call(monkeypatch):
    """Timing µs-scale kernels must not include sdpa_kernel's host cost on every call."""
    import contextlib

    from servelab.studies.s05_attention import variants

    entered = []

    @contextlib.contextmanager
    def counting(name):
        entered.append(name)
        yield

    monkeypatch.setattr(variants, "forced", counting)
    shape = AttentionShape.prefill(GQA, 32)
    q, k, v = shape.random_inputs(torch.float32, "cpu")
    attn = get_variant("sdpa_math").build(shape, "cpu")
    attn(q, k, v)
    assert entered == ["math"]  # alone, each call forces its backend
    with attn.held():
        for _ in range(5):
            attn(q, k, v)
    assert entered == ["math", "math"]  # held: once for all five
    get_variant("sdpa_default").build(shape, "cpu")(q, k, v)
    assert entered == ["math", "math"]  # the default dispatch forces nothing
