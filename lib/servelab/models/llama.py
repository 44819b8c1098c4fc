"""The Llama/Qwen2 family over a flat ragged batch with a paged KV cache.

Qwen2 is Llama with biases on the q/k/v projections. q/k/v are fused into one matmul and gate/up
into another (fewer, larger kernels); the fusion happens when Hugging Face weights are loaded
(``load_hf_state_dict``), so any checkpoint the model loader accepts works.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from servelab.models.layers.attention import AttentionMetadata, PagedAttention
from servelab.models.layers.norm import RMSNorm
from servelab.models.layers.rotary import RotaryEmbedding, apply_rotary
from servelab.models.shape import ModelShape


class LlamaBlock(nn.Module):
    def __init__(self, layer: int, s: ModelShape, eps: float, backend: str):
        super().__init__()
        self.s = s
        self.input_norm = RMSNorm(s.hidden, eps)
        self.qkv = nn.Linear(s.hidden, s.q_dim + 2 * s.kv_dim, bias=s.qkv_bias)
        self.attn = PagedAttention(layer, s.heads, s.kv_heads, s.head_dim, s.head_dim ** -0.5, backend)
        self.o_proj = nn.Linear(s.q_dim, s.hidden, bias=False)
        self.post_norm = RMSNorm(s.hidden, eps)
        self.gate_up = nn.Linear(s.hidden, 2 * s.intermediate, bias=False)
        self.down = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, h, rope, meta, kv):
        s = self.s
        x = self.input_norm(h)
        q, k, v = self.qkv(x).split([s.q_dim, s.kv_dim, s.kv_dim], dim=-1)
        q = q.view(-1, s.heads, s.head_dim)
        k = k.view(-1, s.kv_heads, s.head_dim)
        v = v.view(-1, s.kv_heads, s.head_dim)
        q, k = apply_rotary(q, k, *rope)
        h = h + self.o_proj(self.attn(q, k, v, meta, kv))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


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
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.shape.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv, logits_indices=None):
        h = self.embed(input_ids)
        rope = self.rotary(positions, h.dtype)  # once per step, shared by every layer
        for block in self.layers:
            h = block(h, rope, meta, kv)
        if logits_indices is not None:
            h = h[logits_indices]
        return self.lm_head(self.norm(h))

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
