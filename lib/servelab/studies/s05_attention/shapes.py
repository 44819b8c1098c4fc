"""What one attention call computes: the architecture's heads and the call's shape, with its FLOPs and bytes.

FLOPs: QKᵀ and PV are 2·D FLOPs each per (query, key) pair and head, so 4·B·H·D·pairs, counting only the
pairs the mask allows (causal prefill: L(L+1)/2 ≈ L²/2, the causal half; decode: one query × L keys).
Bytes: the fewest that must cross HBM: Q, K, V read once and the output written once; for decode the
K and V reads (2·B·L·H_kv·D·bytes) are all that matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from servelab.studies.s05_attention.masks import Mask


@dataclass(frozen=True)
class Architecture:
    """The attention heads of a model: query heads, K/V heads (fewer under GQA) and head dimension."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self):
        for k in ("heads", "kv_heads", "head_dim"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @classmethod
    def from_model(cls, model: str, head_dim: int | None = None) -> Architecture:
        """Heads of a shipped config (``data/models/<model>/config.json``), optionally at another head dim."""
        from transformers import AutoConfig

        from servelab.models.loader import CONFIG_DIR
        from servelab.models.shape import ModelShape

        path = CONFIG_DIR / model / "config.json"
        if not path.exists():
            raise ValueError(
                f"no shipped config {model!r}; have {sorted(p.parent.name for p in CONFIG_DIR.glob('*/config.json'))}"
            )
        cfg = AutoConfig.for_model(**json.loads(path.read_text()))
        s = ModelShape.from_config(cfg)
        return cls(model, s.heads, s.kv_heads, head_dim or s.head_dim)

    @property
    def group(self) -> int:
        """Query heads per K/V head (1: multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def label(self) -> str:
        return f"{self.name} ({self.heads}q/{self.kv_heads}kv, D={self.head_dim})"


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: ``batch`` rows of ``q_len`` queries against ``kv_len`` keys, for every head."""

    arch: Architecture
    batch: int
    q_len: int
    kv_len: int
    mask: Mask = field(default_factory=Mask)

    def __post_init__(self):
        for k in ("batch", "q_len", "kv_len"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        self.mask.check_lengths(self.q_len, self.kv_len)

    @classmethod
    def prefill(cls, arch: Architecture, length: int, batch: int = 1, mask: Mask | None = None) -> AttentionShape:
        return cls(arch, batch, length, length, mask or Mask("causal"))

    @classmethod
    def decode(cls, arch: Architecture, kv_len: int, batch: int) -> AttentionShape:
        """One new query token per sequence against ``kv_len`` cached keys (it sees all of them)."""
        return cls(arch, batch, 1, kv_len, Mask("none"))

    @property
    def pairs(self) -> int:
        return self.batch * self.mask.allowed_pairs(self.q_len, self.kv_len)

    @property
    def flops(self) -> float:
        """4·B·H·D·(allowed pairs): QKᵀ and PV, masked pairs not counted."""
        return 4.0 * self.arch.heads * self.arch.head_dim * self.pairs

    def kv_bytes(self, dtype_bytes: int) -> int:
        """K and V read once: 2·B·L_kv·H_kv·D·bytes."""
        return 2 * self.batch * self.kv_len * self.arch.kv_heads * self.arch.head_dim * dtype_bytes

    def q_bytes(self, dtype_bytes: int) -> int:
        """Q (and, equally, the output): B·H·L_q·D·bytes."""
        return self.batch * self.arch.heads * self.q_len * self.arch.head_dim * dtype_bytes

    def min_bytes(self, dtype_bytes: int) -> int:
        """The HBM traffic floor: Q, K, V read once, output written once."""
        return self.kv_bytes(dtype_bytes) + 2 * self.q_bytes(dtype_bytes)

    def input_bytes(self, dtype_bytes: int) -> int:
        """Bytes of the Q, K, V tensors themselves (what 'peak memory including inputs' adds)."""
        return self.kv_bytes(dtype_bytes) + self.q_bytes(dtype_bytes)

    def random_inputs(self, dtype, device, seed: int = 0):
        """Q (B,H,Lq,D), K and V (B,H_kv,Lkv,D), standard normal: never zeros, which run faster."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        a = self.arch
        q = torch.randn(self.batch, a.heads, self.q_len, a.head_dim, generator=gen, device=device, dtype=dtype)
        k = torch.randn(self.batch, a.kv_heads, self.kv_len, a.head_dim, generator=gen, device=device, dtype=dtype)
        v = torch.randn(self.batch, a.kv_heads, self.kv_len, a.head_dim, generator=gen, device=device, dtype=dtype)
        return q, k, v

    def describe(self) -> dict:
        """Tidy columns naming this shape, for a result row."""
        a = self.arch
        return dict(
            arch=a.name,
            heads=a.heads,
            kv_heads=a.kv_heads,
            head_dim=a.head_dim,
            batch=self.batch,
            q_len=self.q_len,
            kv_len=self.kv_len,
            mask=self.mask.kind,
            mask_label=self.mask.label,
        )
