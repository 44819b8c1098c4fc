"""The step budget (``python -m servelab.bench.step_budget``): kernel classes by name, the timeline arithmetic on
synthetic profiler traces, the floors, and a run of the tiny model on the CPU end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from servelab.bench import step_budget, step_budget_kind
from servelab.bench.kernel_classes import CLASSES, SAMPLING_PHASE, classify
from servelab.bench.step_budget import (
    CPU_KINDS,
    CSV,
    GPU_KINDS,
    KERNELS_CSV,
    SIDECAR,
    BudgetPlan,
    BudgetSession,
    main,
    run_budget,
)
from servelab.bench.step_budget_kind import EAGER, budget_call, measure_kind
from servelab.bench.step_floors import class_floors, class_work, elementwise_elems_per_token, linear_dims
from servelab.bench.step_timeline import CALL, SAMPLING, StepBudget, union_us
from servelab.bench.step_timeline import step_budget as budget_of
from servelab.measure import Roofline
from servelab.models import ModelShape

# ---- kernel classes ---------------------------------------------------------------------------------------------

KERNELS = [
    # GEMM: cuBLAS / cuBLASLt, CUTLASS, Inductor's mm template
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "gemm"),
    ("nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("aten::linear", "gemm"),
    ("aten::addmm", "gemm"),
    # attention: flash, memory-efficient (built from CUTLASS), cuDNN, the engine's Triton kernels, SDPA's math softmax
    (
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, cutlass::bfloat16_t>, false, true>",
        "attention",
    ),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64, 128, 4>, true>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("_paged_decode_kernel", "attention"),
    ("_merge_splits_kernel", "attention"),
    ("_ragged_kernel", "attention"),
    ("_long_tile_kernel", "attention"),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*)",
        "attention",
    ),
    ("aten::scaled_dot_product_attention", "attention"),
    # norm and elementwise: Inductor's fused kernels (a cast's _to_copy and RoPE's cat in the name), torch's own
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm_elementwise"),
    ("triton_poi_fused_add_cat_mul_neg_slice_1", "norm_elementwise"),
    ("triton_per_fused_add_mean_mul_pow_rsqrt_2", "norm_elementwise"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, char*>",
        "norm_elementwise",
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
        "norm_elementwise",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1> >",
        "norm_elementwise",
    ),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norm_elementwise"),
    ("aten::rsqrt", "norm_elementwise"),
    ("aten::add_", "norm_elementwise"),
    ("aten::mul", "norm_elementwise"),
    # sampling: argmax, top-k, a fused sampler, the exponential race's draw
    (
        "void at::native::reduce_kernel<512, 1, ReduceOp<c10::BFloat16, at::native::ArgMaxOps<c10::BFloat16>>>",
        "sampling",
    ),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo)", "sampling"),
    ("triton_red_fused__softmax_argmax_div_exponential_0", "sampling"),
    ("void at::native::distribution_elementwise_grid_stride_kernel<float, 4, exponential_kernel<float>>", "sampling"),
    ("aten::argmax", "sampling"),
    ("aten::multinomial", "sampling"),
    # copies: memcpy/memset, concatenation, casts, gathers (embedding, paged K/V), the KV-cache write
    ("Memcpy DtoD (Device -> Device)", "copies"),
    ("Memcpy HtoD (Pageable -> Device)", "copies"),
    ("Memset (Device)", "copies"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 2, 128, 1>", "copies"),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
        "copies",
    ),
    (
        "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>",
        "copies",
    ),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<float>>", "copies"),
    ("triton_poi_fused_index_copy_3", "copies"),
    ("aten::embedding", "copies"),
    ("aten::index_copy_", "copies"),
    ("aten::copy_", "copies"),
    ("aten::to", "copies"),
    # other: views and allocations on a CPU, a kernel nothing names
    ("aten::view", "other"),
    ("aten::empty", "other"),
    ("my_custom_kernel_v2", "other"),
]


@pytest.mark.parametrize(("name", "expected"), KERNELS)
def test_kernel_names_are_classified(name, expected):
    assert classify(name) == expected


def test_every_class_is_covered_by_the_examples():
    assert {cls for _, cls in KERNELS} == set(CLASSES)


def test_whatever_the_sampler_launches_is_sampling():
    softmax = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(float*)"
    cast = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>"
    assert classify(softmax) == "attention" and classify(softmax, SAMPLING_PHASE) == "sampling"
    assert classify(cast, SAMPLING_PHASE) == "sampling" and classify("nvjet_sm90_tst", "") == "gemm"


# ---- the timeline ----------------------------------------------------------------------------------------------


def test_union_counts_overlapping_intervals_once():
    assert union_us([], []) == 0
    assert union_us([0, 5, 20], [10, 8, 30]) == 20  # 5–8 lies inside 0–10
    assert union_us([0, 5], [10, 15]) == 15  # overlap 5–10 counted once
    assert union_us([5, 0], [10, 5]) == 10  # touching, and out of order
    assert union_us([0, 0], [4, 4]) == 4  # the same interval twice


def x(cat, name, ts, dur, tid=1, corr=None):
    """A complete event as Kineto's Chrome trace writes it."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur} | (
        {"args": {"correlation": corr}} if corr is not None else {}
    )


def kernel(name, start, end, corr=None):
    return x("kernel", name, start, end - start, tid=7, corr=corr)


def synthetic_trace():
    """Two profiled calls after a warm-up one (ignored).

    Call 0, range 0–100 µs: inputs copied (10–12), a CUDA graph of three kernels (GEMM 15–25 and attention 24–30
    overlap by 1 µs, a norm 35–40), the sampler (a softmax 62–64 and an argmax 65–66, launched inside the sampling
    range), the tokens to the host (70–71). Span 10–71 = 61; busy 2 + 15 + 5 + 2 + 1 + 1 = 26; idle 35; the
    graph spans 15–40 with 20 busy: 5 idle inside it; host 100 − 61 = 39.
    Call 1, range 200–260: a graph of one GEMM 210–220, and a memset with no launch in the trace (placed by its
    start, 225–226). Span 16, busy 11, idle 5, graph idle 0, host 60 − 16 = 44.
    """
    return [
        x("user_annotation", "warmup", -60, 50),
        x("cuda_runtime", "cudaGraphLaunch", -50, 3, corr=99),
        kernel("nvjet_sm90_warm", -40, -30, corr=99),
        kernel("Memset (Device)", -20, -19),  # before the first call: belongs to none
        x("user_annotation", CALL + "0", 0, 100),
        x("gpu_user_annotation", CALL + "0", 10, 61, tid=7),  # the GPU-side copy of the range: not a call
        x("cuda_runtime", "cudaMemcpyAsync", 2, 1, corr=1),
        kernel("Memcpy HtoD (Pageable -> Device)", 10, 12, corr=1),
        x("cuda_runtime", "cudaGraphLaunch_v10000", 5, 4, corr=2),
        kernel("nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT", 15, 25, corr=2),
        kernel("_paged_decode_kernel", 24, 30, corr=2),
        kernel("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 35, 40, corr=2),
        x("user_annotation", SAMPLING, 50, 10),
        x("cuda_runtime", "cudaLaunchKernel", 52, 1, corr=3),
        kernel("void at::native::cunn_SoftMaxForward<4, float>", 62, 64, corr=3),
        x("cuda_runtime", "cudaLaunchKernel", 55, 1, corr=4),
        kernel("void at::native::reduce_kernel<512, 1, ReduceOp<float, ArgMaxOps<float>>>", 65, 66, corr=4),
        x("cuda_runtime", "cudaMemcpyAsync", 61, 1, corr=5),
        kernel("Memcpy DtoH (Device -> Pinned)", 70, 71, corr=5),
        x("cuda_runtime", "cudaDeviceSynchronize", 62, 37, corr=6),
        x("user_annotation", CALL + "1", 200, 60),
        x("cuda_runtime", "cudaGraphLaunch", 205, 2, corr=12),
        kernel("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_split", 210, 220, corr=12),
        kernel("Memset (Device)", 225, 226),
        {"ph": "s", "cat": "ac2g", "name": "flow", "ts": 5, "id": 2},  # flow arrows: not complete events
    ]


def test_budget_of_a_synthetic_trace():
    b = budget_of(synthetic_trace())
    assert b.calls == 2 and not b.graph_kernels_hidden and b.graph_launches == 1
    assert b.wall_ms == pytest.approx((100 + 60) / 2e3)
    assert b.gpu_span_ms == pytest.approx((61 + 16) / 2e3)
    assert b.busy_ms == pytest.approx((26 + 11) / 2e3)
    assert b.idle_gap_ms == pytest.approx((35 + 5) / 2e3)
    assert b.graph_span_ms == pytest.approx((25 + 10) / 2e3)
    assert b.graph_idle_ms == pytest.approx((5 + 0) / 2e3)
    assert b.host_ms == pytest.approx((39 + 44) / 2e3)
    busy = b.classes.busy_ms * 2e3  # µs summed over the two calls
    # the attention kernel (24-30) starts before the GEMM (15-25) ends, as a dependent launch does: it is given
    # the 5 µs it adds to the union, not its 6, so the classes add up to the busy union
    assert busy.to_dict() == pytest.approx(
        {"gemm": 20, "attention": 5, "norm_elementwise": 5, "sampling": 3, "copies": 2 + 1 + 1, "other": 0}
    )
    assert b.classes.busy_ms.sum() == pytest.approx(b.busy_ms)
    assert (b.classes.kernels * 2).to_dict() == {
        "gemm": 2,
        "attention": 1,
        "norm_elementwise": 1,
        "sampling": 2,
        "copies": 3,
        "other": 0,
    }
    # the parts add up: busy + idle + host is the call's wall time
    assert b.busy_ms + b.idle_gap_ms + b.host_ms == pytest.approx(b.wall_ms)
    # per kernel, per call: the two GEMMs are two names, each launched in one call of two; the memset in one
    k = b.kernels.set_index("kernel")
    assert k.busy_ms.sum() == pytest.approx(b.classes.busy_ms.sum())
    assert list(b.kernels.busy_ms) == sorted(b.kernels.busy_ms, reverse=True)
    gemm = k.loc["nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT"]
    assert gemm["class"] == "gemm" and gemm.launches == 0.5 and gemm.busy_ms == pytest.approx(5e-3)
    assert gemm.launch_us == pytest.approx(10)
    assert k.loc["Memset (Device)", "launches"] == 0.5  # the one before the first call belongs to none
    assert "nvjet_sm90_warm" not in k.index  # the warm-up call's
    assert k.loc["_paged_decode_kernel", "class"] == "attention"


def test_overlapping_kernels_are_each_given_what_they_add_to_the_union():
    """Launches that start while the one before drains (programmatic dependent launch) and then wait: each is given
    the time past every earlier one's end, so a chain's times add up to its busy union, never more."""
    from servelab.bench.step_timeline import exclusive_us, union_us

    starts, ends = [0, 8, 9, 30, 30, 31], [10, 20, 15, 40, 35, 33]
    assert list(exclusive_us(starts, ends)) == [10, 10, 0, 10, 0, 0]  # 9-15 and 30-35 inside others; ties: longer
    assert union_us(starts, ends) == 30 == exclusive_us(starts, ends).sum()
    assert list(exclusive_us([5, 0], [7, 2])) == [2, 2]  # in the given order, walked in start order
    assert list(exclusive_us([], [])) == []


def test_a_graph_whose_kernels_the_profiler_did_not_see_is_flagged():
    events = [
        x("user_annotation", CALL + "0", 0, 100),
        x("cuda_runtime", "cudaMemcpyAsync", 2, 1, corr=1),
        kernel("Memcpy HtoD (Pageable -> Device)", 10, 12, corr=1),
        x("cuda_runtime", "cudaGraphLaunch", 5, 4, corr=2),  # nothing in the trace ran from it
    ]
    b = budget_of(events)
    assert b.graph_kernels_hidden and math.isnan(b.graph_span_ms)
    # kernels with no launch in the trace may be the graph's: not flagged then
    seen = events + [kernel("nvjet_sm90_tst", 20, 30)]
    assert not budget_of(seen).graph_kernels_hidden


def test_a_cpu_trace_reads_the_outermost_operators():
    events = [
        x("user_annotation", CALL + "0", 0, 40),
        x("cpu_op", "aten::linear", 1, 9),
        x("cpu_op", "aten::addmm", 2, 7),  # inside aten::linear: not counted again
        x("cpu_op", "aten::softmax", 12, 2),  # outside the sampler: SDPA's, by its name
        x("user_annotation", SAMPLING, 19, 4),
        x("cpu_op", "aten::softmax", 20, 1),
        x("cpu_op", "aten::argmax", 21, 1),
        x("cpu_op", "aten::mul", 25, 5, tid=2),  # another thread's
        x("cpu_op", "aten::empty", 45, 1),  # after the call
    ]
    b = budget_of(events)
    assert b.classes.kernels.to_dict() == {
        "gemm": 1,
        "attention": 1,
        "norm_elementwise": 0,
        "sampling": 2,
        "copies": 0,
        "other": 0,
    }
    assert b.gpu_span_ms == pytest.approx(21e-3) and b.busy_ms == pytest.approx(13e-3)
    assert b.host_ms == pytest.approx(19e-3) and math.isnan(b.graph_idle_ms)


def test_a_trace_without_profiled_calls_is_refused():
    with pytest.raises(ValueError, match="no profiled call"):
        budget_of([x("cpu_op", "aten::mm", 0, 1)])


# ---- floors ----------------------------------------------------------------------------------------------------

TINY = ModelShape("llama", 2, 8, 2, 1, 4, 16, 32, 0, True, False)  # layers, hidden, heads, kv heads, head dim, I, V


def test_linear_dims_are_the_models_matmul_weights():
    from transformers import AutoConfig

    from servelab.paths import REPO_ROOT

    for name in ("qwen2-0.5b", "gpt2", "llama-3-8b"):
        shape = ModelShape.from_config(AutoConfig.from_pretrained(REPO_ROOT / "data" / "models" / name))
        assert sum(i * o for i, o in linear_dims(shape)) == shape.layer_matmul_params, name


def test_class_work_of_one_decode_by_hand():
    # q_dim 8, kv_dim 4; matmul weights per layer 8·16 + 8·8 + 8·32 + 16·8 = 576, 1152 over two layers
    w = class_work(TINY, [(10, 1)], sampled_rows=1, dtype_bytes=2, logits_bytes=2)
    assert list(w) == list(CLASSES)
    assert w["gemm"].flops == 2 * 1152 + 2 * 8 * 32
    assert w["gemm"].nbytes == 2 * (1152 + 32 * 8) + 2 * (2 * (24 + 16 + 40 + 24) + (8 + 32))
    assert w["attention"].flops == 4 * 2 * 2 * 4 * (10 + 1)
    kv_token = 2 * 2 * 1 * 4 * 2
    assert w["attention"].nbytes == kv_token * 11 + 2 * 2 * 1 * 2 * 8
    assert elementwise_elems_per_token(TINY) == 8 * 8 + 2 * (8 + 4) + 3 * 16
    assert w["norm_elementwise"].nbytes == 2 * (2 * 136 + 2 * 8) and w["norm_elementwise"].flops == 0
    assert w["sampling"].nbytes == 32 * 2
    assert w["copies"].nbytes == 2 * kv_token + 2 * 2 * 8
    assert w["other"].nbytes == w["other"].flops == 0


def test_prefill_attention_is_causal_and_counts_every_token():
    w = class_work(TINY, [(0, 4), (3, 1)], sampled_rows=2, dtype_bytes=2, logits_bytes=4)
    assert w["attention"].flops == 4 * 2 * 2 * 4 * ((4 * 5 / 2) + (3 + 1))
    assert w["gemm"].flops == 2 * 5 * 1152 + 2 * 2 * 8 * 32
    assert w["sampling"].nbytes == 2 * 32 * 4


def test_floors_take_the_slower_of_compute_and_memory():
    w = class_work(TINY, [(10, 1)], sampled_rows=1, dtype_bytes=2, logits_bytes=2)
    memory = class_floors(w, Roofline(matmul_tflop_s=1.0, copy_gb_s=1.0))  # 1 byte/ns, 1000 FLOP/ns
    assert memory["gemm"] == (pytest.approx(w["gemm"].nbytes * 1e-6), "memory")
    assert memory["other"] == (0.0, "")
    compute = class_floors(w, Roofline(matmul_tflop_s=1e-6, copy_gb_s=1.0))  # 1 FLOP/µs
    assert compute["gemm"] == (pytest.approx(w["gemm"].flops * 1e-3), "compute")
    assert compute["sampling"] == (pytest.approx(64e-6), "memory")  # no FLOPs counted: bytes set it


# ---- step kinds and the run ------------------------------------------------------------------------------------


def test_the_gpu_step_kinds_are_the_issues_and_the_servers():
    assert [k.name for k in GPU_KINDS] == [
        "decode_b1_ctx128",
        "decode_b64_ctx512",
        "decode_b1_ctx16384",
        "mixed_d63_ctx512_chunk512",
        "mixed_d3_ctx2432_chunk512",  # Study 1's server: decodes of its contexts beside a chunk
        "mixed_d24_ctx2304_chunk512",
        "prefill_b1_4096",
    ]
    assert [k.kind for k in GPU_KINDS] == ["decode", "decode", "decode", "mixed", "mixed", "mixed", "prefill"]
    assert [k.tokens for k in GPU_KINDS] == [1, 64, 1, 575, 515, 536, 4096]
    assert [k.kind for k in CPU_KINDS] == [k.kind for k in GPU_KINDS]


def test_bad_arguments_are_refused(capsys):
    assert main(["--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


CPU_PLAN = BudgetPlan("config:tiny-qwen2", "float32", "cpu", CPU_KINDS, 3, 1, 0, 600.0)


@pytest.fixture(scope="module")
def session():
    return BudgetSession(CPU_PLAN, log=lambda *a: None)


def test_the_budget_call_is_the_engines_step(session):
    fn = step_budget_kind._build(session, CPU_KINDS[1], graphs=True)
    logits, items = fn.engine.runner.logits(fn.step)
    inflight = budget_call(fn.engine, fn.step, mark=True)()
    assert inflight.tokens() == logits.argmax(-1).tolist() and len(items) == 4  # greedy: the argmax of each row
    assert fn.path() == "eager"  # no CUDA graph on a CPU


def test_a_graph_the_profiler_cannot_see_into_is_profiled_without_graphs(session, monkeypatch):
    hidden = StepBudget(
        1,
        pd.DataFrame({"kernels": 0.0, "busy_ms": 0.0}, index=list(CLASSES)),
        9,
        8,
        1,
        7,
        math.nan,
        math.nan,
        1,
        1,
        True,
    )
    eager = dataclasses.replace(
        hidden, classes=hidden.classes.assign(busy_ms=0.25), busy_ms=1.5, graph_kernels_hidden=False
    )
    built = []
    real_build = step_budget_kind._build
    monkeypatch.setattr(
        step_budget_kind, "_build", lambda s, k, graphs: built.append(graphs) or real_build(s, k, graphs)
    )
    budgets = iter([hidden, eager])
    monkeypatch.setattr(step_budget_kind, "profile_budget", lambda *a: next(budgets))
    rows = pd.DataFrame(measure_kind(session, CPU_KINDS[0]))
    assert built == [True, False]  # the step as run, then the same step without graphs
    assert set(rows.profile_source) == {EAGER} and (rows.busy_ms == 0.25).all()
    r = rows.iloc[0]
    assert r.idle_gap_ms == pytest.approx(r.step_ms - 1.5) and r.host_ms == pytest.approx(r.wall_ms - r.step_ms)
    assert math.isnan(r.gpu_span_ms) and r.busy_union_ms == 1.5 and r.profiled_wall_ms == r.wall_ms


def test_a_failing_step_kind_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    closed = []
    fake = SimpleNamespace(
        dev=SimpleNamespace(slug="cpu", as_dict=dict, close=lambda: closed.append(1)),
        ceilings=SimpleNamespace(as_dict=dict),
        free=lambda: None,
    )

    def measure(session, kind, kernels_out=None):
        kernels_out.append({"step": kind.name, "kernel": "k", "class": "gemm", "busy_ms": 1.0})
        if kind.batch == 4:
            raise RuntimeError("out of memory")
        return [
            kind.columns() | {"class": c, "step_ms": 1.0, "path": "eager", "profile_source": "as run"} for c in CLASSES
        ]

    def session(plan, log):
        fake.plan = plan
        return fake

    monkeypatch.setattr(step_budget, "BudgetSession", session)
    monkeypatch.setattr(step_budget, "measure_kind", measure)
    table = run_budget(dataclasses.replace(CPU_PLAN, kinds=CPU_KINDS[:3]), tmp_path, log=lambda *a: None)
    status = table.groupby("step", sort=False)["status"].first()
    assert status.isna().tolist() == [True, False, True]  # measured rows carry their own status
    assert status.iloc[1] == "error: RuntimeError: out of memory"
    assert len(pd.read_csv(tmp_path / CSV)) == 3 * len(CLASSES)
    assert len(pd.read_csv(tmp_path / KERNELS_CSV)) == 3  # what each kind gave before it failed or returned
    late = run_budget(
        dataclasses.replace(CPU_PLAN, kinds=CPU_KINDS[:2], time_budget_s=-1), tmp_path, log=lambda *a: None
    )
    assert set(late.status) == {"skipped: time budget"}
    assert json.loads((tmp_path / SIDECAR).read_text())["complete"] is True
    assert closed == [1, 1]  # each complete run stamps the clocks at its end before its last record


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("step_budget")
    args = ["--model", "config:tiny-qwen2", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert main(args + ["--repeats", "3", "--profiled-calls", "1"]) == 0
    return out


def test_the_cpu_run_writes_every_step_kind_and_class(cpu_run):
    t = pd.read_csv(cpu_run / CSV)
    assert list(t.step.unique()) == [k.name for k in CPU_KINDS]
    assert all(classes == list(CLASSES) for classes in t.groupby("step")["class"].apply(list))
    assert (t.status == "ok").all() and (t.profile_source == "as run").all() and (t.path == "eager").all()
    by = t.set_index(["step", "class"])
    for k in CPU_KINDS:
        assert by.loc[(k.name, "gemm"), "kernels"] >= 1 and by.loc[(k.name, "gemm"), "floor_ms"] > 0
        assert by.loc[(k.name, "attention"), "kernels"] >= 1 and by.loc[(k.name, "sampling"), "kernels"] >= 1
    assert (t.busy_ms >= 0).all() and (t.floor_ms >= 0).all() and (t.idle_gap_ms >= 0).all()
    assert (t.host_ms >= 0).all() and (t.gpu_span_ms <= t.profiled_wall_ms).all()
    steps = t.groupby("step", sort=False).first()
    assert (steps.step_floor_ms - t.groupby("step", sort=False).floor_ms.sum()).abs().max() < 1e-12
    assert steps.loc["prefill_b1_128", "tokens"] == 128 and steps.loc["mixed_d3_ctx16_chunk16", "sampled_rows"] == 4
    gemm = by.xs("gemm", level="class").floor_ms
    assert gemm["prefill_b1_128"] > gemm["decode_b1_ctx16"]


def test_the_cpu_run_writes_each_step_kinds_kernels(cpu_run):
    k = pd.read_csv(cpu_run / KERNELS_CSV)
    t = pd.read_csv(cpu_run / CSV)
    assert list(k.step.unique()) == [kind.name for kind in CPU_KINDS]
    assert set(k["class"]) <= set(CLASSES) and (k.launches > 0).all() and (k.launch_us >= 0).all()
    for step, g in k.groupby("step", sort=False):
        assert list(g["rank"]) == list(range(len(g))) and g.busy_ms.is_monotonic_decreasing
        # the kernels add up to their classes (on a CPU, the outermost operators)
        classes = t[t.step == step].set_index("class")
        per_class = g.groupby("class").agg(launches=("launches", "sum"), busy_ms=("busy_ms", "sum"))
        for cls, r in per_class.iterrows():
            assert r.launches == pytest.approx(classes.at[cls, "kernels"])
            assert r.busy_ms == pytest.approx(classes.at[cls, "busy_ms"])
    assert k.kernel.str.len().max() <= 200


def test_the_cpu_run_records_where_and_how_it_ran(cpu_run):
    side = json.loads((cpu_run / SIDECAR).read_text())
    assert side["complete"] is True and side["files"] == [CSV, KERNELS_CSV] and side["what"] == "step_budget"
    assert side["device"]["kind"] == "cpu" and side["device"]["torch"] and "triton" in side["versions"]
    assert side["ceilings"]["copy_gb_s"] > 0 and side["git_commit"]
    assert side["params"]["kinds"] == [k.name for k in CPU_KINDS] and side["params"]["repeats"] == 3
    assert not (cpu_run / "run.json").exists()  # the benchmark's sidecar in the same folder is left alone


def test_every_kernel_the_engine_launches_has_a_class():
    """Each Triton kernel under ``servelab/kernels`` that is launched (``name[grid](``, autotuned, or handed to a
    launcher), not a helper inlined into one, lands in a class with a floor: the long-tile attention kernel, which
    runs every chunk of 128 tokens or more since issue 29, read as "other", whose floor is 0."""
    import re

    from servelab.paths import REPO_ROOT

    src = "\n".join(p.read_text() for p in sorted((REPO_ROOT / "lib/servelab/kernels").glob("*.py")))
    jit = set(re.findall(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+)", src))
    launched = {n for n in jit if re.search(rf"\b{n}\s*\[|\)\(\s*{n}\s*\)|_launch\(\s*{n}\b", src)}
    assert {"_long_tile_kernel", "_ragged_kernel", "_paged_decode_kernel", "_small_linear"} <= launched
    assert {n: classify(n) for n in launched if classify(n) == "other"} == {}
