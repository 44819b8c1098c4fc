"""F4.1: KV bytes per token, by the formula and as actually allocated (HF's cache and this project's pool).

    bytes/token = 2 (K and V) × layers × kv_heads × head_dim × dtype bytes

The formula is checked two ways: against the tensors HF's ``DynamicCache`` holds after a forward pass
(element bytes, and the bytes of the storages behind them, which would expose views onto larger buffers),
and against a ``KVPool`` allocated for the same architecture (its storage bytes and, on CUDA, the growth of
``torch.cuda.memory_allocated``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class KVGeometry:
    """What sets the size of one token's K/V: layers, KV heads, head size.

    Duck-types as a ``ModelShape`` for ``KVPool.for_model``/``block_bytes`` (families ``ModelShape`` lacks, e.g. MQA).
    """

    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def attention(self) -> str:
        """MHA (kv_heads = heads), MQA (one KV head) or GQA (in between)."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """2 × layers × kv_heads × head_dim × dtype_bytes (bytes)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_config(cls, cfg) -> KVGeometry:
        """From an HF config: the families ``ModelShape`` knows, plus GPTBigCode (multi-query)."""
        from servelab.models.shape import ModelShape

        if getattr(cfg, "model_type", "") == "gpt_bigcode":
            kv_heads = 1 if cfg.multi_query else cfg.n_head
            return cls(cfg.n_layer, cfg.n_head, kv_heads, cfg.n_embd // cfg.n_head)
        s = ModelShape.from_config(cfg)
        return cls(s.layers, s.heads, s.kv_heads, s.head_dim)


def hf_cache_bytes(model, batch: int, tokens: int, seed: int = 0) -> dict:
    """Run one forward of ``batch`` × ``tokens`` random ids with ``use_cache=True``; measure the returned cache.

    Returns ``tensor_bytes`` (numel × element size of every K and V tensor), ``storage_bytes`` (bytes of the
    distinct storages behind them) and ``cached_tokens`` (batch × sequence length the cache reports).
    """
    import torch

    gen = torch.Generator(device=model.device).manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=model.device, generator=gen)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return dict(
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors),
        storage_bytes=sum(storages.values()),
        cached_tokens=batch * cache.get_seq_length(),
        cache_layers=len(cache.layers),
        cache_tensor_shape=str(tuple(tensors[0].shape)),
        cache_dtype=str(tensors[0].dtype).replace("torch.", ""),
    )


def pool_bytes(geom: KVGeometry, dtype, device, num_blocks: int = 8, block_size: int = 16) -> dict:
    """Allocate a ``KVPool`` of ``num_blocks × block_size`` token slots; measure its storage and allocator growth."""
    import torch

    from servelab.kv.pool import KVPool

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
    pool = KVPool(geom.layers, num_blocks, block_size, geom.kv_heads, geom.head_dim, dtype, device)
    allocated = torch.cuda.memory_allocated(device) - before if cuda else None
    out = dict(pool_slots=pool.num_slots, pool_storage_bytes=pool.nbytes, pool_allocator_bytes=allocated)
    del pool
    return out


def model_config(spec: str):
    """The HF config of a loader spec (``config:<name>``, a directory or a hub id), without loading weights."""
    from transformers import AutoConfig

    from servelab.models.loader import CONFIG_DIR, CONFIG_PREFIX

    if spec.startswith(CONFIG_PREFIX):
        return AutoConfig.from_pretrained(CONFIG_DIR / spec[len(CONFIG_PREFIX) :])
    return AutoConfig.from_pretrained(spec)


def bytes_per_token_table(
    cases, device, *, batch: int = 2, tokens: int = 64, pool_blocks: int = 8, block_size: int = 16
) -> pd.DataFrame:
    """One row per case ``(model spec, dtype, check_hf)``: formula vs HF cache vs paged pool, bytes per token.

    With ``check_hf`` false only the pool is checked (the model is not loaded: for a model too large or too slow
    to initialise in a smoke run). A case that fails (e.g. out of memory) becomes a row with its status.
    """
    import gc

    import torch

    from servelab.kv.pool import as_torch_dtype
    from servelab.models import load_model

    rows = []
    for spec, dtype, check_hf in cases:  # a few cases: no progress bar on the page
        row = dict(model=spec, dtype=dtype, hf_checked=bool(check_hf))
        try:
            geom = KVGeometry.from_config(model_config(spec))
            dtype_bytes = as_torch_dtype(dtype).itemsize
            if check_hf:
                lm = load_model(spec, dtype=dtype, device=device)
                row.update(hf_cache_bytes(lm.model, batch, tokens))
                del lm
            pool = pool_bytes(geom, dtype, device, pool_blocks, block_size)
            row.update(
                attention=geom.attention,
                layers=geom.layers,
                heads=geom.heads,
                kv_heads=geom.kv_heads,
                head_dim=geom.head_dim,
                dtype_bytes=dtype_bytes,
                formula_bytes=geom.kv_bytes_per_token(dtype_bytes),
                **pool,
                status="ok",
            )
        except torch.OutOfMemoryError:
            row.update(status="oom")
        except (RuntimeError, ValueError, OSError) as e:
            row.update(status=f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("tensor_bytes", "storage_bytes", "cached_tokens", "pool_allocator_bytes"):
        if col not in df:
            df[col] = np.nan
    ok = df["status"] == "ok"
    df["hf_bytes_per_token"] = df["tensor_bytes"] / df["cached_tokens"]
    df["hf_storage_bytes_per_token"] = df["storage_bytes"] / df["cached_tokens"]
    if ok.any():
        df.loc[ok, "pool_bytes_per_token"] = df.loc[ok, "pool_storage_bytes"] / df.loc[ok, "pool_slots"]
    df["pool_allocator_bytes_per_token"] = df["pool_allocator_bytes"].astype(float) / df.get("pool_slots", np.nan)
    checks = [
        "hf_bytes_per_token",
        "hf_storage_bytes_per_token",
        "pool_bytes_per_token",
        "pool_allocator_bytes_per_token",
    ]
    if ok.any():
        # a check that was not made (NaN) neither confirms nor refutes; every check that was made must be exact
        made = df.loc[ok, checks].notna()
        equal = df.loc[ok, checks].eq(df.loc[ok, "formula_bytes"], axis=0)
        df.loc[ok, "exact"] = (equal | ~made).all(axis=1)
        df.loc[ok, "checks_made"] = made.sum(axis=1)
    return df
