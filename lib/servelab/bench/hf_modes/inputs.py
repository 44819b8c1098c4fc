"""Random step inputs: token ids and a pre-filled KV context (random values, never zeros)."""

from __future__ import annotations


def random_ids(model, batch: int, tokens: int, generator):
    import torch

    vocab = model.config.vocab_size
    dev = model.device
    return torch.randint(0, vocab, (batch, tokens), device=dev, generator=generator)


def random_kv(model, batch: int, context: int, generator):
    """Per layer (K, V) of shape (batch, kv_heads, context, head_dim), N(0,1) in the model's dtype."""
    import torch

    from servelab.models.shape import ModelShape

    s = ModelShape.from_config(model.config)
    shape = (batch, s.kv_heads, context, s.head_dim)
    return [
        (
            torch.randn(shape, device=model.device, dtype=model.dtype, generator=generator),
            torch.randn(shape, device=model.device, dtype=model.dtype, generator=generator),
        )
        for _ in range(s.layers)
    ]
