"""A Llama/Qwen2 model's decode blocks through ``kernels.small_linear`` at a small batch (issue 29).

Why: at batch 1 a decode step of Qwen2-0.5B is a chain of about 320 tiny launches (the H200 step budget: 121
matmul-class, 121 norm and elementwise, 57 copies, 24 attention), and each costs its latency more than its bytes.
With ``use_small_linear(model)`` a block at most ``max_rows`` tokens wide (one by default: ``PAYS_UP_TO``) runs

    norm_linear (add + RMSNorm + qkv) -> rope_kv_write (RoPE + the pool write) -> attention
    -> linear (o_proj) -> norm_linear (add + RMSNorm + gate_up) -> silu_mul_linear (SiLU·up + down)

six launches a layer, with no ``torch.compile`` needed for them; wider steps (prefill, mixed, large batches) run
the model's own block functions, compiled or not. With ``rope_in_qkv=True`` the first two are one launch
(``norm_linear_rope_kv``: RoPE and the pool write in the qkv projection's epilogue), five a layer; the blocks'
``forward`` then takes the small rows itself, since the block functions do not see the pool.
``fused_rope_kv_write`` is switched on with it: measured alone it made the engine slower (the issue's table),
because the blocks it leaves to Inductor lose the fusions RoPE was part of; here small_linear does that fusion for
the rows where it pays.

The rows test is on the host, per call: a CUDA graph captures one batch size, so each captured graph holds one
path. The engine switches a model to it where ``EngineConfig.small_batch`` says (on by default where
``fused_rope_kv_write`` is, issue 29). ``scripts/bench_small_batch_step.py`` times an engine built on such a model
against the engine without it on a GPU, and ``tests/test_small_batch_blocks.py`` checks HF's greedy tokens under
Triton's interpreter.
"""

from __future__ import annotations

import types

from servelab.errors import ParameterError
from servelab.kernels.small_linear import MAX_ROWS, RopeKV, linear, norm_linear, norm_linear_rope_kv, silu_mul_linear

# The widest step the switch takes by default. On the H100
# (data/dev/nvidia-h100/2026-12-06/small_batch_step_cf2a53d.csv) a whole decode step of Qwen2-0.5B through
# small_linear took 1.03 ms against the default's 1.08 at one row, but 1.56 against 1.21 at four rows and 2.66
# against 1.23 at eight: each row's reduction runs in turn inside a program, so past one row cuBLAS's GEMM wins.
# ``max_rows`` up to MAX_ROWS still runs the kernel wider, for its benchmarks.
PAYS_UP_TO = 1


def small_batch_fns(pre, post, max_rows: int = PAYS_UP_TO):
    """Block functions with ``models.llama``'s signatures (``attention_qkv``, ``attention_outputs``) that run
    ``small_linear`` at ``max_rows`` tokens or fewer and ``pre`` / ``post`` above."""
    if not 1 <= max_rows <= MAX_ROWS:
        raise ParameterError(f"max_rows must be 1 to {MAX_ROWS}, got {max_rows}")

    def small_pre(h, delta, norm_w, eps, qkv_w, qkv_b):
        if h.shape[0] > max_rows:
            return pre(h, delta, norm_w, eps, qkv_w, qkv_b)
        return norm_linear(h, delta, norm_w, eps, qkv_w, qkv_b)

    def small_post(h, attn, o_w, norm_w, eps, gate_up_w, down_w):
        if h.shape[0] > max_rows:
            return post(h, attn, o_w, norm_w, eps, gate_up_w, down_w)
        # attention_outputs rounds h + o_proj(attn) once, then norms it: norm_linear's residual add does the same
        h, gate_up = norm_linear(h, linear(attn.reshape(attn.shape[0], -1), o_w), norm_w, eps, gate_up_w)
        return h, silu_mul_linear(gate_up, down_w)

    small_pre.small_batch = small_post.small_batch = True  # what ``uses_small_linear`` reads
    return small_pre, small_post


def rope_in_qkv_forward(block, max_rows: int):
    """A ``LlamaBlock.forward`` whose rows up to ``max_rows`` run the qkv projection, RoPE and the pool write in one
    launch (``norm_linear_rope_kv``), then attention and the block's post function; wider steps, or a block whose
    fused RoPE + KV-write path is off, run ``LlamaBlock.forward`` itself."""
    wide = type(block).forward

    def forward(self, h, delta, rope, meta, kv, fns):
        if h.shape[0] > max_rows or not self.fused_rope_kv_write:
            return wide(self, h, delta, rope, meta, kv, fns)
        s, layer = self.s, self.attn.layer
        pool = RopeKV(*rope, meta.slot_mapping, kv.k[layer], kv.v[layer], s.heads, s.kv_heads, s.head_dim)
        h, q = norm_linear_rope_kv(h, delta, self.input_norm.weight, self.eps, self.qkv.weight, self.qkv.bias, pool)
        attn = self.attn(q, None, meta, kv)  # K and V are in the pool already
        w = (self.o_proj.weight, self.post_norm.weight, self.eps, self.gate_up.weight, self.down.weight)
        return fns[1](h, attn, *w)

    forward.rope_in_qkv = True
    return types.MethodType(forward, block)


def runs_on(model) -> bool:
    """Whether the small blocks can run ``model``: a Llama/Qwen2 model held whole by this process (a tensor-parallel
    shard's o_proj and down need an all-reduce that the fused blocks do not make)."""
    from servelab.models.llama import LlamaModel

    return isinstance(model, LlamaModel) and not getattr(model, "sharded", False)


def use_small_linear(model, max_rows: int = PAYS_UP_TO, rope_in_qkv: bool = True) -> None:
    """Switch a ``models.llama.LlamaModel`` to small_linear blocks at ``max_rows`` tokens or fewer, and RoPE + KV
    write in one kernel (``set_fused_rope_kv_write(True)``). Build the engine after, with
    ``fused_rope_kv_write=True`` in its config (the engine sets the config's value on the model). A later
    ``compile_blocks`` (the engine's ``torch.compile``) compiles the wide path and keeps the small one. With
    ``rope_in_qkv`` (the default) the small rows also take RoPE and the pool write into the qkv launch
    (``rope_in_qkv_forward``): on an H100 that cut the one-row Qwen2-0.5B step 7–8% against six launches a layer, in
    two processes (``data/dev/nvidia-h100/2026-12-06/small_batch_step_check_{f714d0b,4773714}.csv``)."""
    if not hasattr(model, "set_fused_rope_kv_write"):
        raise ParameterError(f"{type(model).__name__} has no fused RoPE + KV-write path (Llama/Qwen2 do)")
    model.set_fused_rope_kv_write(True)
    model.block_fns = small_batch_fns(*model.block_fns, max_rows=max_rows)
    if rope_in_qkv:
        for block in model.layers:
            block.forward = rope_in_qkv_forward(block, max_rows)
    compile_blocks = model.compile_blocks

    def compile_then_small(**compile_kw):
        compile_blocks(**compile_kw)
        model.block_fns = small_batch_fns(*model.block_fns, max_rows=max_rows)

    model.compile_blocks = compile_then_small


def uses_small_linear(model) -> bool:
    """Whether ``model``'s block functions are ``small_batch_fns``' (a compile or a switch may replace them)."""
    return all(getattr(fn, "small_batch", False) for fn in model.block_fns)
