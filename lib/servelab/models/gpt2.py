"""The GPT-2 family over a flat ragged batch with a paged KV cache.

Learned absolute position embeddings, pre-LayerNorm blocks, a GELU MLP and an LM head tied to the
token embedding. Blocks are split around attention into two tensor-only functions, as in
``llama.py``, so that ``compile_blocks`` can fuse their elementwise work. HF stores GPT-2's projections as
``Conv1D`` (weight ``[in, out]``); they are transposed into ``nn.Linear`` layout when weights are loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from servelab.kernels.attention import AttentionMetadata, PagedAttention
from servelab.models.layers.compiled import compiled
from servelab.models.shape import ModelShape

# "gelu_new" is GELU's tanh approximation; torch's fused kernel computes the same formula in one
# kernel (HF spells it out in seven), equal up to float rounding.
ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def attention_inputs(h, delta, ln_w, ln_b, eps: float, qkv_w, qkv_b, heads: int, head_dim: int):
    """``h (+ delta)`` -> (residual stream, q [T, H, D], K and V stacked [2, T, H, D])."""
    if delta is not None:
        h = h + delta
    qkv = F.linear(F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps), qkv_w, qkv_b)
    qkv = qkv.view(-1, 3, heads, head_dim)
    return h, qkv[:, 0], qkv[:, 1:].transpose(0, 1)


def attention_outputs(h, attn, proj_w, proj_b, ln_w, ln_b, eps: float, fc_w, fc_b, out_w, out_b, approximate: str):
    """-> (residual stream after attention, MLP output still to be added)."""
    h = h + F.linear(attn, proj_w, proj_b)
    x = F.gelu(F.linear(F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps), fc_w, fc_b), approximate=approximate)
    return h, F.linear(x, out_w, out_b)


class GPT2Block(nn.Module):
    def __init__(self, layer: int, s: ModelShape, eps: float, approximate: str, backend: str):
        super().__init__()
        self.s, self.approximate = s, approximate
        self.ln_1 = nn.LayerNorm(s.hidden, eps=eps)
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden)
        self.attn = PagedAttention(layer, s.heads, s.heads, s.head_dim, s.head_dim**-0.5, backend)
        self.attn_proj = nn.Linear(s.hidden, s.hidden)
        self.ln_2 = nn.LayerNorm(s.hidden, eps=eps)
        self.fc = nn.Linear(s.hidden, s.intermediate)
        self.mlp_proj = nn.Linear(s.intermediate, s.hidden)

    def forward(self, h, delta, meta, kv, fns):
        """``(h, delta)`` -> ``(h, delta)``: the residual stream and the MLP output not yet added to it."""
        s, (pre, post) = self.s, fns
        h, q, kv_new = pre(
            h,
            delta,
            self.ln_1.weight,
            self.ln_1.bias,
            self.ln_1.eps,
            self.qkv.weight,
            self.qkv.bias,
            s.heads,
            s.head_dim,
        )
        attn = self.attn(q, kv_new, meta, kv)
        return post(
            h,
            attn,
            self.attn_proj.weight,
            self.attn_proj.bias,
            self.ln_2.weight,
            self.ln_2.bias,
            self.ln_2.eps,
            self.fc.weight,
            self.fc.bias,
            self.mlp_proj.weight,
            self.mlp_proj.bias,
            self.approximate,
        )


class GPT2Model(nn.Module):
    """``forward(input_ids [T], positions [T], meta, kv, logits_indices) -> logits [len(logits_indices), vocab]``."""

    family = "gpt2"

    def __init__(self, config, *, max_positions: int | None = None, attention_backend: str = "gather"):
        super().__init__()
        act = getattr(config, "activation_function", "gelu_new")
        if act not in ACTIVATIONS:
            raise NotImplementedError(f"activation_function {act!r}: implemented are {sorted(ACTIVATIONS)}")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if getattr(config, flag, False):
                raise NotImplementedError(f"GPT-2 with {flag}=True is not implemented")
        if not getattr(config, "scale_attn_weights", True):
            raise NotImplementedError("GPT-2 with scale_attn_weights=False is not implemented")
        self.config = config
        self.shape = s = ModelShape.from_config(config)
        self.max_positions = min(max_positions or s.positions, s.positions)
        self.wte = nn.Embedding(s.vocab, s.hidden)
        self.wpe = nn.Embedding(s.positions, s.hidden)
        self.layers = nn.ModuleList(
            GPT2Block(i, s, config.layer_norm_epsilon, ACTIVATIONS[act], attention_backend) for i in range(s.layers)
        )
        self.ln_f = nn.LayerNorm(s.hidden, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        self.block_fns = (attention_inputs, attention_outputs)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.wte.weight

    def compile_blocks(self, **compile_kw) -> None:
        """Run the blocks' elementwise work through ``torch.compile`` (one compilation serves every layer)."""
        self.block_fns = (compiled(attention_inputs, **compile_kw), compiled(attention_outputs, **compile_kw))

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv, logits_indices=None):
        h, delta = self.wte(input_ids) + self.wpe(positions), None
        for block in self.layers:
            h, delta = block(h, delta, meta, kv, self.block_fns)
        h = h + delta
        if logits_indices is not None:
            h = h[logits_indices]
        return self.lm_head(self.ln_f(h))

    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict) -> None:
        """Copy a Hugging Face ``GPT2LMHeadModel`` state dict in (Conv1D weights transposed)."""
        sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
        self.wte.weight.copy_(sd["wte.weight"])
        self.wpe.weight.copy_(sd["wpe.weight"])
        self.ln_f.weight.copy_(sd["ln_f.weight"])
        self.ln_f.bias.copy_(sd["ln_f.bias"])
        pairs = {
            "ln_1": "ln_1",
            "ln_2": "ln_2",
            "qkv": "attn.c_attn",
            "attn_proj": "attn.c_proj",
            "fc": "mlp.c_fc",
            "mlp_proj": "mlp.c_proj",
        }
        for i, b in enumerate(self.layers):
            for ours, theirs in pairs.items():
                mod, p = getattr(b, ours), f"h.{i}.{theirs}."
                w = sd[p + "weight"]
                mod.weight.copy_(w if ours.startswith("ln") else w.t())
                mod.bias.copy_(sd[p + "bias"])
