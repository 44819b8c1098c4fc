"""RoPE + KV-cache write in one Triton kernel (``kernels/rope_kv_write.py``) against the unfused PyTorch path.

Under Triton's interpreter (a child process: the interpreter is chosen when a kernel is defined) the kernel is
bitwise the PyTorch path in float32 (``apply_rotary`` then ``KVPool.write``) at head_dim 64 and 80, with and
without grouped heads; in bfloat16 it is bitwise that path computed in float32 and rounded once (as Inductor's
fused RoPE computes it). Every pool slot it was not asked to write keeps its bytes. The engine with
``fused_rope_kv_write=True`` gives HF's greedy tokens in float32 on every attention path. On a CUDA device
(skipped without one) the compiled kernel is checked the same way, and captured steps against HF.
"""

import os
import textwrap

import pytest
import torch
from interpreted import run_interpreted

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.errors import ParameterError
from servelab.kv.pool import KVPool
from servelab.models import load_model
from servelab.models.layers.rotary import apply_rotary

SHAPES = [(14, 2, 64), (4, 4, 80), (6, 2, 80), (3, 1, 16)]  # (heads, kv_heads, head_dim): GQA, MHA, padded halves


def case(heads, kv_heads, head_dim, dtype, device="cpu", tokens=7, seed=0):
    """qkv, cos, sin, distinct slots (half the pool's), and two equal pools filled with random bytes."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    angles = torch.randn(tokens, head_dim // 2, generator=g) * 3
    emb = torch.cat([angles, angles], -1)  # RotaryEmbedding's layout: both halves share a frequency
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
    blocks = -(-2 * tokens // 4)
    slots = torch.randperm(4 * blocks, generator=g)[:tokens]
    pool = KVPool(2, blocks, 4, kv_heads, head_dim, dtype, device)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=g))
    ref_pool = KVPool(2, blocks, 4, kv_heads, head_dim, dtype, device)
    ref_pool.kv.copy_(pool.kv)
    return qkv.to(device), cos.to(device), sin.to(device), slots.to(device), pool, ref_pool


def unfused(qkv, cos, sin, slots, pool, layer, heads, kv_heads, head_dim, upcast=False):
    """The model's path without the kernel: RoPE (``apply_rotary``), then the pool write; returns q."""
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.reshape(-1, heads, head_dim), k.reshape(-1, kv_heads, head_dim), v.reshape(-1, kv_heads, head_dim)
    if upcast:  # float32 arithmetic, one rounding at the end
        rq, rk = apply_rotary(q.float(), k.float(), cos.float(), sin.float())
        rq, rk = rq.to(qkv.dtype), rk.to(qkv.dtype)
    else:
        rq, rk = apply_rotary(q, k, cos, sin)
    pool.write(layer, slots, rk, v)
    return rq


def test_the_flag_is_validated_and_refused_where_the_kernel_cannot_run():
    with pytest.raises(ParameterError, match="fused_rope_kv_write"):
        EngineConfig(fused_rope_kv_write="yes")
    assert EngineConfig().fused_rope_kv_write == "auto"  # on where it runs (issue 29): CUDA with Triton
    hf = load_model("config:tiny-gpt2").model
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16))  # "auto" on a model with no such path: off
    assert engine.stats()["fused_rope_kv_write"] is False
    with pytest.raises(ParameterError, match="Llama/Qwen2"):
        Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16, fused_rope_kv_write=True))
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    hf = load_model("config:tiny-llama").model
    with pytest.raises(ParameterError, match="CUDA device or TRITON_INTERPRET=1|needs Triton"):
        Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16, fused_rope_kv_write=True))
    # "auto" on a CPU: the unfused path, with no error
    assert Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16)).stats()["fused_rope_kv_write"] is False


def test_auto_takes_the_fused_kernel_on_cuda_where_triton_imports():
    from servelab.engine.engine import fused_rope_kv_runs
    from servelab.models.llama import rope_kv_write

    assert fused_rope_kv_runs(torch.device("cuda")) is (rope_kv_write is not None)
    assert fused_rope_kv_runs(torch.device("cpu")) is False


def test_bad_shapes_are_refused_before_launch():
    pytest.importorskip("triton")
    from servelab.kernels.rope_kv_write import rope_kv_write

    qkv, cos, sin, slots, pool, _ = case(4, 2, 16, torch.float32)
    k, v = pool.k[0], pool.v[0]
    with pytest.raises(ParameterError, match="qkv must be"):
        rope_kv_write(qkv[:, :-1], cos, sin, slots, k, v, 4, 2, 16)
    with pytest.raises(ParameterError, match="even head_dim"):
        rope_kv_write(qkv, cos, sin, slots, k, v, 4, 2, 15)
    with pytest.raises(ParameterError, match="slots must be"):
        rope_kv_write(qkv, cos, sin, slots[:-1], k, v, 4, 2, 16)
    with pytest.raises(ParameterError, match="cos must be"):
        rope_kv_write(qkv, cos[:, :, :8], sin, slots, k, v, 4, 2, 16)
    with pytest.raises(ParameterError, match="k_cache must be"):
        rope_kv_write(qkv, cos, sin, slots, pool.k[0, ..., :8], v, 4, 2, 16)
    with pytest.raises(ParameterError, match="multiple of kv_heads"):
        rope_kv_write(qkv, cos, sin, slots, k, v, 3, 2, 16)


def test_kernel_compiles_for_the_h200_without_fma_contraction():
    """The compiled path the interpreter never takes (constexpr branches, casts, nested calls), built ahead of time
    for sm90 with no GPU here: every float product and sum is rounded on its own (``mul.rn``, no ``fma``), which is
    what makes the GPU's float32 result bitwise the eager path's."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from servelab.kernels.rope_kv_write import COMPILE_OPTIONS
    from servelab.kernels.rope_kv_write import _rope_kv_write_kernel as kernel

    for elem, (heads, kv_heads, head_dim) in [("fp32", (14, 2, 64)), ("bf16", (6, 2, 80))]:
        const = {
            "HEADS": heads,
            "KV_HEADS": kv_heads,
            "HEAD_DIM": head_dim,
            "HEADS_PAD": triton.next_power_of_2(heads),
            "KV_HEADS_PAD": triton.next_power_of_2(kv_heads),
            "HALF_PAD": triton.next_power_of_2(head_dim // 2),
            "RNE_BY_HAND": False,
        }
        sig = {n: "i64" if n.startswith("stride") else "i32" for n in kernel.arg_names}
        sig.update({n: "*" + elem for n in ("QKV", "COS", "SIN", "Q_OUT", "K_CACHE", "V_CACHE")}, SLOTS="*i64")
        sig.update(dict.fromkeys(const, "constexpr"))
        src = ASTSource(kernel, sig, constexprs={(kernel.arg_names.index(n),): v for n, v in const.items()})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=COMPILE_OPTIONS).asm["ptx"]
        assert "mul.rn.f32" in ptx and "fma" not in ptx, elem


INTERPRETED_CHECK = textwrap.dedent("""
    import torch
    import servelab.models.llama as llama
    import tests.test_engine_head_sizes as heads_test
    import tests.test_rope_kv_write as t
    from servelab.engine import Engine, EngineConfig
    from servelab.kernels.rope_kv_write import rope_kv_write

    for shape in t.SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            qkv, cos, sin, slots, pool, ref_pool = t.case(*shape, dtype)
            q = rope_kv_write(qkv, cos, sin, slots, pool.k[1], pool.v[1], *shape)
            ref = t.unfused(qkv, cos, sin, slots, ref_pool, 1, *shape, upcast=dtype != torch.float32)
            assert torch.equal(q, ref), (shape, dtype, (q.float() - ref.float()).abs().max())
            assert torch.equal(pool.kv, ref_pool.kv), (shape, dtype)  # the slots asked for, and nothing else
            if dtype == torch.bfloat16:  # the eager bfloat16 path rounds each product: a rounding or two apart
                eager = t.unfused(qkv, cos, sin, slots, ref_pool, 1, *shape)
                torch.testing.assert_close(q, eager, rtol=2 ** -7, atol=2 ** -7)

    calls = []
    real = llama.rope_kv_write
    llama.rope_kv_write = lambda *a: calls.append(1) or real(*a)
    runs = [("tiny-llama", "gather", False), ("tiny-llama", "triton", True), ("tiny-llama-hd80", "triton", False),
            ("tiny-llama-hd80", "reference", False)]
    for name, backend, whole_steps in runs:
        hf, prompts, refs = heads_test.hf_case(name)
        chunked = dict(max_num_seqs=4, max_num_batched_tokens=16) if whole_steps else {}
        cfg = EngineConfig(block_size=4, num_blocks=64, attention_backend=backend, fused_rope_kv_write=True, **chunked)
        engine = Engine.from_hf(hf, cfg)
        if whole_steps:  # the padded whole-step path (ragged kernel) that CUDA graphs capture, run eagerly
            engine.runner.enable_step_graphs([4, 8, 16], capture=False)
        before = len(calls)
        assert engine.generate(prompts, heads_test.GREEDY) == refs, (name, backend)
        assert len(calls) - before == engine.steps * hf.config.num_hidden_layers, (name, backend)
        if whole_steps:
            assert engine.runner.step_graph_steps == engine.steps
    print("ok")
""")


def test_kernel_is_the_pytorch_path_and_the_engine_gives_hf_tokens_under_the_interpreter():
    run_interpreted(INTERPRETED_CHECK)


# ---- on a CUDA device (the H200 runs these) --------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_kernel_matches_the_pytorch_path(shape, dtype):
    from servelab.kernels.rope_kv_write import rope_kv_write

    qkv, cos, sin, slots, pool, ref_pool = case(*shape, dtype, device="cuda", tokens=300)
    q = rope_kv_write(qkv, cos, sin, slots, pool.k[1], pool.v[1], *shape)
    ref = unfused(qkv, cos, sin, slots, ref_pool, 1, *shape, upcast=dtype != torch.float32)
    # bitwise, as under the interpreter: the kernel is launched with FMA contraction off
    assert torch.equal(q, ref), (q.float() - ref.float()).abs().max()
    assert torch.equal(pool.kv, ref_pool.kv)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family",
    # quick: the padded head (80 in 128 lanes, RoPE halves of 40), at the hd80 family test's block size, whose
    # kernels the quick tier builds anyway
    ["tiny-qwen2", "tiny-llama", pytest.param("tiny-llama-hd80", marks=pytest.mark.gpu_quick)],
)
def test_captured_steps_with_the_fused_kernel_give_hf_greedy_tokens_in_float32(family):
    from hf_reference import hf_greedy, varied

    from tests.test_gpu_engine import GREEDY, STEPS

    # varied weights: at the loader's init tiny-qwen2 repeats one token whatever the attention reads
    hf = varied(family).cuda()
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (6, 19, 33, 2, 45, 300)]
    cfg = EngineConfig(
        block_size=4, num_blocks=512, max_num_seqs=4, max_num_batched_tokens=64, fused_rope_kv_write=True
    )
    engine = Engine.from_hf(hf, cfg)
    st = engine.stats()
    assert st["fused_rope_kv_write"] and engine.step_graphs_status.startswith("on"), st
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts, STEPS)
    st = engine.stats()
    assert st["graph_steps"] > 0 and st["step_graph_steps"] > 0 and st["eager_steps"] == 0, st


@pytest.mark.gpu
def test_compiled_bf16_engine_with_the_fused_kernel_agrees_with_the_default_engine():
    """bf16, compile on (the benchmark's configuration): the fused engine's greedy tokens are the default's
    on most steps (bf16 near-ties may flip a token, and everything after it)."""
    hf = load_model("config:tiny-qwen2", dtype="bfloat16", device="cuda").model
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (5, 40, 17, 64)]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    cfg = {"block_size": 16, "num_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 128, "compile": True}
    ref = Engine.from_hf(hf, EngineConfig(**cfg)).generate(prompts, greedy)
    engine = Engine.from_hf(hf, EngineConfig(**cfg, fused_rope_kv_write=True))
    assert engine.stats()["compile"].startswith("on"), engine.stats()["compile"]
    got = engine.generate(prompts, greedy)
    first = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
        for x, y in zip(got, ref, strict=True)
    ]
    assert sum(first) >= 0.75 * sum(map(len, ref)), first
