"""The Llama/Qwen2 family over a flat ragged batch with a paged KV cache.

Qwen2 is Llama with biases on the q/k/v projections. q/k/v are fused into one matmul and gate/up
into another (fewer, larger kernels); the fusion happens when Hugging Face weights are loaded
(``load_hf_state_dict``), so any checkpoint the model loader accepts works.

A block is two pure functions around attention: ``attention_inputs`` (residual add, RMSNorm, qkv,
RoPE) and ``attention_outputs`` (o_proj, residual, RMSNorm, MLP). They take tensors only, so one
``torch.compile`` of each serves every layer (``compile_blocks``): Inductor fuses their elementwise
work (norms, RoPE, SiLU·up, residual adds) into a few kernels, which matters most for decode, where
a step is a long chain of tiny kernels. The residual add of one block's MLP output is deferred to the
next block's ``attention_inputs``, where it fuses with the norm.

With ``set_fused_rope_kv_write(True)`` (``EngineConfig.fused_rope_kv_write``) a block runs ``attention_qkv``
instead (residual add, RMSNorm, qkv) and one Triton kernel applies RoPE and writes K/V into the pool
(``kernels/rope_kv_write.py``), so attention skips its own pool write: one kernel less per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from servelab.errors import ParameterError
from servelab.kernels.attention import AttentionMetadata, PagedAttention
from servelab.models.layers.compiled import compiled
from servelab.models.layers.norm import RMSNorm, rms_norm
from servelab.models.layers.rotary import RotaryEmbedding, apply_rotary
from servelab.models.shape import ModelShape

try:  # the fused kernel loads only where Triton imports
    from servelab.kernels.rope_kv_write import rope_kv_write, runs_here
except ImportError:
    rope_kv_write = runs_here = None


def attention_qkv(h, delta, norm_w, eps: float, qkv_w, qkv_b):
    """``h (+ delta)`` -> (residual stream, qkv [T, (H + 2·H_kv)·D]), RoPE not applied."""
    if delta is not None:
        h = h + delta
    return h, F.linear(rms_norm(h, norm_w, eps), qkv_w, qkv_b)


def attention_inputs(h, delta, norm_w, eps: float, qkv_w, qkv_b, cos, sin, heads: int, kv_heads: int, head_dim: int):
    """``h (+ delta)`` -> (residual stream, q [T, H, D], K and V stacked [2, T, H_kv, D])."""
    h, qkv = attention_qkv(h, delta, norm_w, eps, qkv_w, qkv_b)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = apply_rotary(q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), cos, sin)
    return h, q, torch.stack((k, v.view(-1, kv_heads, head_dim)))  # stacked: one pool write for both


def attention_outputs(h, attn, o_w, norm_w, eps: float, gate_up_w, down_w):
    """-> (residual stream after attention, MLP output still to be added)."""
    h = h + F.linear(attn, o_w)
    gate, up = F.linear(rms_norm(h, norm_w, eps), gate_up_w).chunk(2, dim=-1)
    return h, F.linear(F.silu(gate) * up, down_w)


def final_norm(h, delta, norm_w, eps: float):
    """The last block's deferred residual add and the final RMSNorm."""
    return rms_norm(h + delta, norm_w, eps)


class LlamaBlock(nn.Module):
    def __init__(self, layer: int, s: ModelShape, eps: float, backend: str):
        super().__init__()
        self.s, self.eps = s, eps
        self.input_norm = RMSNorm(s.hidden, eps)
        self.qkv = nn.Linear(s.hidden, s.q_dim + 2 * s.kv_dim, bias=s.qkv_bias)
        self.attn = PagedAttention(layer, s.heads, s.kv_heads, s.head_dim, s.head_dim**-0.5, backend)
        self.o_proj = nn.Linear(s.q_dim, s.hidden, bias=False)
        self.post_norm = RMSNorm(s.hidden, eps)
        self.gate_up = nn.Linear(s.hidden, 2 * s.intermediate, bias=False)
        self.down = nn.Linear(s.intermediate, s.hidden, bias=False)
        self.fused_rope_kv_write = False  # set by LlamaModel.set_fused_rope_kv_write, with its block_fns

    def forward(self, h, delta, rope, meta, kv, fns):
        """``(h, delta)`` -> ``(h, delta)``: the residual stream and the MLP output not yet added to it."""
        s, (pre, post) = self.s, fns
        if self.fused_rope_kv_write:  # pre is attention_qkv: RoPE and the pool write are one kernel
            h, qkv = pre(h, delta, self.input_norm.weight, self.eps, self.qkv.weight, self.qkv.bias)
            layer = self.attn.layer
            q = rope_kv_write(qkv, *rope, meta.slot_mapping, kv.k[layer], kv.v[layer], s.heads, s.kv_heads, s.head_dim)
            kv_new = None  # already in the pool
        else:
            h, q, kv_new = pre(
                h,
                delta,
                self.input_norm.weight,
                self.eps,
                self.qkv.weight,
                self.qkv.bias,
                *rope,
                s.heads,
                s.kv_heads,
                s.head_dim,
            )
        attn = self.attn(q, kv_new, meta, kv)
        return post(h, attn, self.o_proj.weight, self.post_norm.weight, self.eps, self.gate_up.weight, self.down.weight)


class LlamaModel(nn.Module):
    """``forward(input_ids [T], positions [T], meta, kv, logits_indices) -> logits [len(logits_indices), vocab]``."""

    family = "llama"

    def __init__(self, config, *, max_positions: int | None = None, attention_backend: str = "gather"):
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r}: only silu is implemented")
        if getattr(config, "mlp_bias", False):
            raise NotImplementedError("mlp_bias=True is not implemented")
        self.config = config
        self.shape = s = ModelShape.from_config(config)
        self.max_positions = max_positions or config.max_position_embeddings
        self.rotary = RotaryEmbedding(config, self.max_positions)
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(LlamaBlock(i, s, config.rms_norm_eps, attention_backend) for i in range(s.layers))
        self.norm = RMSNorm(s.hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        self.fused_rope_kv_write = False
        self.block_fns = (attention_inputs, attention_outputs)
        self.final_norm = final_norm
        self.tie_weights()

    def set_fused_rope_kv_write(self, on: bool) -> None:
        """RoPE and the KV-pool write in one Triton kernel per layer (on) or as before (off); blocks eager again
        (``compile_blocks`` after, if wanted). Refused where the kernel cannot run: no Triton, or neither CUDA
        nor Triton's interpreter. Setting the state it is in changes nothing (compiled blocks stay compiled)."""
        if bool(on) == self.fused_rope_kv_write:
            return
        if on:
            device = next(self.parameters()).device
            if rope_kv_write is None:
                raise ParameterError("fused_rope_kv_write needs Triton, which does not import here")
            if not runs_here(device):
                raise ParameterError(
                    f"fused_rope_kv_write needs a CUDA device or TRITON_INTERPRET=1; the model is on {device}"
                )
        self.fused_rope_kv_write = bool(on)
        for block in self.layers:
            block.fused_rope_kv_write = self.fused_rope_kv_write
        self.block_fns = (self._pre_fn(), attention_outputs)

    def _pre_fn(self):
        return attention_qkv if self.fused_rope_kv_write else attention_inputs

    def tie_weights(self) -> None:
        if self.shape.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def compile_blocks(self, **compile_kw) -> None:
        """Run the blocks' elementwise work through ``torch.compile`` (one compilation serves every layer)."""
        self.block_fns = (compiled(self._pre_fn(), **compile_kw), compiled(attention_outputs, **compile_kw))
        self.final_norm = compiled(final_norm, **compile_kw)

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv, logits_indices=None):
        h, delta = self.embed(input_ids), None
        rope = self.rotary(positions, h.dtype)  # once per step, shared by every layer
        for block in self.layers:
            h, delta = block(h, delta, rope, meta, kv, self.block_fns)
        if logits_indices is not None:  # only the rows that sample need the norm and the LM head
            h, delta = h[logits_indices], delta[logits_indices]
        return self.lm_head(self.final_norm(h, delta, self.norm.weight, self.norm.eps))

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict) -> None:
        """Copy a Hugging Face ``LlamaForCausalLM``/``Qwen2ForCausalLM`` state dict in, fusing q/k/v and gate/up."""
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
        self.embed.weight.copy_(sd["embed_tokens.weight"])
        self.norm.weight.copy_(sd["norm.weight"])
        if not self.shape.tied_embeddings:
            self.lm_head.weight.copy_(sd["lm_head.weight"])
        for i, b in enumerate(self.layers):
            p = f"layers.{i}."
            b.input_norm.weight.copy_(sd[p + "input_layernorm.weight"])
            b.post_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
            b.qkv.weight.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
            if b.qkv.bias is not None:
                b.qkv.bias.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]))
            b.o_proj.weight.copy_(sd[p + "self_attn.o_proj.weight"])
            b.gate_up.weight.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
            b.down.weight.copy_(sd[p + "mlp.down_proj.weight"])
