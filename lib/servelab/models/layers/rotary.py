"""Rotary position embeddings (RoPE) for a flat batch of tokens with arbitrary positions.

The inverse frequencies come from Hugging Face's own RoPE initialisation for the config, so every
``rope_type`` HF computes statically (default, linear, llama3, yarn, ...) matches it exactly; the
dynamic types, which change with the sequence length, are refused. cos/sin are tabulated once in
float32 for every position and cast to the activation dtype on use, as HF does.
"""

from __future__ import annotations

import torch
from torch import nn


def rope_inverse_frequencies(config) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim/2] float32, attention_scaling)`` exactly as HF computes them for ``config``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device("cpu"):  # also when a model is being built on the meta device
        rope = LlamaRotaryEmbedding(config)
    if "dynamic" in str(getattr(rope, "rope_type", "")):
        raise NotImplementedError(f"rope_type {rope.rope_type!r} depends on the sequence length; not supported")
    return rope.inv_freq.detach().float().cpu(), float(rope.attention_scaling)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for RoPE (the ``rotate_half`` convention of Llama/Qwen2), looked up per token position."""

    def __init__(self, config, max_positions: int):
        super().__init__()
        inv_freq, scaling = rope_inverse_frequencies(config)
        pos = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
        freqs = torch.outer(pos, inv_freq)  # one float32 multiply per entry, as HF's K=1 matmul
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin of shape [T, 1, head_dim] in ``dtype`` for token positions [T]."""
        return self.cos[positions].to(dtype).unsqueeze(1), self.sin[positions].to(dtype).unsqueeze(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """RoPE on q [T, H, D] and k [T, H_kv, D] with cos/sin from ``RotaryEmbedding``."""
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
