"""One measured point: checked before timed, failures recorded as rows, memory grows as it should."""

import pytest
import torch

from servelab.errors import ParameterError
from servelab.studies.s05_attention.memory import LiveTensorBytes, peak_bytes
from servelab.studies.s05_attention.params import study_params
from servelab.studies.s05_attention.point import TimingPolicy, measure_point
from servelab.studies.s05_attention.reference import check_rows, reference_attention
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.sweep import decode_sweep, prefill_sweep
from servelab.studies.s05_attention.variants import Variant, get_variant

ARCH = Architecture("t", heads=4, kv_heads=2, head_dim=16)
FAST = TimingPolicy(target_ms=1, min_repeats=2, max_repeats=3, warmup=1)


def _point(variant, shape):
    inputs = shape.random_inputs(torch.float32, "cpu")
    rows = check_rows(shape.q_len)
    ref = reference_attention(*inputs, shape.mask, rows)
    return measure_point(variant, shape, inputs, ref, rows, dtype=torch.float32, device="cpu", policy=FAST)


def test_correct_variant_is_timed_with_spread_and_memory():
    shape = AttentionShape.prefill(ARCH, 128)
    row = _point(get_variant("sdpa_default"), shape)
    assert row["status"] == "ok" and row["backend"] == "flash"
    assert row["p25_ms"] <= row["median_ms"] <= row["p75_ms"] and row["repeats"] >= 2
    assert row["peak_mem_bytes"] > 0
    assert row["peak_mem_incl_inputs_bytes"] == row["peak_mem_bytes"] + shape.input_bytes(4)


def test_wrong_variant_is_reported_incorrect_and_not_timed():
    wrong = Variant(
        "wrong",
        "naive",
        None,
        "drops the softmax scale",
        lambda shape, device: lambda q, k, v: get_variant("naive").build(shape, device)(q * 3, k, v),
    )
    row = _point(wrong, AttentionShape.prefill(ARCH, 64))
    assert row["status"] == "incorrect" and row["rel_error"] > row["tolerance"]
    assert "median_ms" not in row


def test_unavailable_and_failing_variants_become_rows():
    shape = AttentionShape.prefill(ARCH, 64)
    assert _point(get_variant("sdpa_cudnn"), shape)["status"] == "unsupported"

    def boom(shape, device):
        def f(q, k, v):
            raise RuntimeError("device lost")

        return f

    row = _point(Variant("boom", "naive", None, "always fails", boom), shape)
    assert row["status"] == "error" and "device lost" in row["reason"]


def test_naive_memory_grows_quadratically_fused_linearly():
    def peak(name, L):
        s = AttentionShape.prefill(ARCH, L)
        q, k, v = s.random_inputs(torch.float32, "cpu")
        attn = get_variant(name).build(s, "cpu")
        return peak_bytes(lambda: attn(q, k, v), "cpu")

    assert peak("naive", 1024) / peak("naive", 256) > 12  # ~16× for 4× length
    assert peak("sdpa_flash", 1024) / peak("sdpa_flash", 256) < 5


def test_tracker_frees_dead_tensors():
    with LiveTensorBytes() as t:
        a = torch.ones(1000)  # 4,000 bytes
        b = a * 2
        del a  # freed: the next tensor reuses its share of the peak
        c = b + 1
        d = c.view(10, 100)  # a view allocates nothing
        assert t.live == 8_000
        del b, c, d
    assert t.peak == 8_000 and t.live == 0


def test_sweeps_skip_over_budget_and_record_every_variant():
    p = prefill_sweep(
        [ARCH],
        [32, 64],
        ["naive", "sdpa_default"],
        dtype=torch.float32,
        device="cpu",
        policy=FAST,
        max_call_ms=1e-9,
        progress=False,
    )
    assert len(p) == 4
    # a call slower than max_call_ms stops that variant at longer lengths
    assert set(p[p["q_len"] == 64]["status"]) == {"skipped"}
    d = decode_sweep(
        [ARCH],
        [16, 4096],
        [1],
        ["sdpa_default"],
        dtype=torch.float32,
        device="cpu",
        policy=FAST,
        max_kv_bytes=100_000,
        progress=False,
    )
    assert d.set_index("kv_len").loc[4096, "status"] == "skipped"
    assert d.set_index("kv_len").loc[16, "status"] == "ok"


@pytest.mark.parametrize(
    "bad",
    [
        dict(dtype="int8"),
        dict(models=["nope"]),
        dict(growth_pairs=[[256, 1024]]),
        dict(variants=["flash3"]),
        dict(head_dims=[0]),
        dict(prefill_lengths=[64, 128]),
        dict(max_kv_gib=-1),
        dict(colour="red"),
        dict(growth_pairs=[[64, 2048 * 32]]),
    ],
)
def test_bad_parameters_raise_parameter_error(bad):
    with pytest.raises(ParameterError):
        study_params("smoke", **bad)


def test_profiles_have_the_seed_comparison_points():
    full = study_params("full")
    assert 2048 in full["prefill_lengths"] and [256, 8192] in full["growth_pairs"]
    assert max(full["decode_kv_lens"]) == 131072 and full["decode_batches"][-1] == 256


def test_refused_grouped_heads_are_measured_repeated_with_the_reason(monkeypatch):
    import warnings

    import torch.nn.functional as F

    real = F.scaled_dot_product_attention

    def picky(q, k, v, *, enable_gqa=False, **kw):
        if enable_gqa:
            warnings.warn("For dense input, both fused kernels require the same num_heads", stacklevel=2)
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", picky)
    row = _point(get_variant("sdpa_flash"), AttentionShape.prefill(ARCH, 64))
    assert row["status"] == "ok" and row["gqa"].startswith("repeat_kv")
    assert "same num_heads" in row["reason"]


def test_backend_is_read_from_kernel_names():
    from servelab.studies.s05_attention.backends import backend_from_kernels, priority_order

    # names as the H200's profiler printed them (2026-12-02)
    assert backend_from_kernels("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") == "cudnn"
    assert backend_from_kernels("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits") == "flash"
    assert backend_from_kernels("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention") == "efficient"
    assert backend_from_kernels("ampere_bf16_s16816gemm; softmax_warp_forward") == "math"
    assert set(priority_order("cpu")) <= {"flash", "efficient", "math", "cudnn"}
