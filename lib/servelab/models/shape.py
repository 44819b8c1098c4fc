"""A model's shape and what one forward costs in FLOPs and bytes, for rooflines and the KV formula.

Counts follow the standard accounting: a matmul of an (m×k) by a (k×n) is 2mkn FLOPs; attention over
c keys costs 4·c·d FLOPs per head per query (QKᵀ and PV); bytes are the fewest that must move through
HBM (each weight read once per forward, each K/V element read once, new K/V written once).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    family: str  # "llama" (Llama/Qwen2) or "gpt2"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    positions: int  # learned position embeddings (GPT-2), else 0
    tied_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, cfg) -> ModelShape:
        mt = getattr(cfg, "model_type", "")
        if mt == "gpt2":
            return cls(
                "gpt2",
                cfg.n_layer,
                cfg.n_embd,
                cfg.n_head,
                cfg.n_head,
                cfg.n_embd // cfg.n_head,
                cfg.n_inner or 4 * cfg.n_embd,
                cfg.vocab_size,
                cfg.n_positions,
                True,
                True,
            )
        if mt in ("llama", "qwen2", "mistral"):
            hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            return cls(
                "llama",
                cfg.num_hidden_layers,
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                hd,
                cfg.intermediate_size,
                cfg.vocab_size,
                0,
                bool(cfg.tie_word_embeddings),
                mt == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            )
        raise ValueError(f"no shape accounting for model_type {mt!r}")

    # ---- parameters -------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of the matmuls in one transformer block (what each token multiplies through)."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mlp = (3 if self.family == "llama" else 2) * h * self.intermediate
        return attn + mlp

    @property
    def layer_params(self) -> int:
        h = self.hidden
        if self.family == "gpt2":
            biases = 3 * h + h + self.intermediate + h
            norms = 2 * 2 * h
        else:
            biases = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
            norms = 2 * h
        return self.layer_matmul_params + biases + norms

    @property
    def params(self) -> int:
        """Total parameter count, as ``sum(p.numel() for p in model.parameters())``."""
        emb = self.vocab * self.hidden + self.positions * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        final_norm = (2 if self.family == "gpt2" else 1) * self.hidden
        return self.layers * self.layer_params + emb + head + final_norm

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies through, excluding the LM head."""
        return self.layers * self.layer_matmul_params

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes read by one forward: all block weights + LM head + norms (embedding rows are negligible)."""
        return (self.layers * self.layer_params + self.vocab * self.hidden + self.hidden) * dtype_bytes

    # ---- KV cache -----------------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """2 (K and V) × layers × kv_heads × head_dim × bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    # ---- costs of one forward -------------------------------------------------------------------------
    def attention_flops(self, query_tokens: int, context: int, causal: bool = True) -> float:
        """QKᵀ and PV FLOPs for ``query_tokens`` new tokens after ``context`` cached ones."""
        t = query_tokens
        keys = t * context + (t * (t + 1) / 2 if causal else t * t)
        return 4.0 * self.layers * self.heads * self.head_dim * keys

    def prefill_flops(self, tokens: int, context: int = 0, batch: int = 1, logits_tokens: int = 1) -> float:
        """FLOPs of prefilling ``tokens`` per sequence after ``context`` cached, for ``batch`` sequences."""
        per_seq = (
            2.0 * self.matmul_params * tokens
            + self.attention_flops(tokens, context)
            + 2.0 * self.vocab * self.hidden * logits_tokens
        )
        return batch * per_seq

    def prefill_bytes(self, tokens: int, context: int = 0, batch: int = 1, dtype_bytes: int = 2) -> float:
        kv = self.kv_bytes_per_token(dtype_bytes)
        return self.weight_bytes(dtype_bytes) + batch * kv * (tokens + context)

    def decode_flops(self, batch: int, context: int) -> float:
        """One decode step: ``batch`` sequences, each one new token after ``context`` cached."""
        return batch * (2.0 * self.matmul_params + self.attention_flops(1, context) + 2.0 * self.vocab * self.hidden)

    def decode_bytes(self, batch: int, context: int, dtype_bytes: int = 2) -> float:
        """Weights once, every cached K/V once, the new K/V once."""
        kv = self.kv_bytes_per_token(dtype_bytes)
        return self.weight_bytes(dtype_bytes) + batch * kv * (context + 1)
