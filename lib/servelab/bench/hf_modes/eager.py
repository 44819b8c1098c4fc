"""HF eager forward with its own DynamicCache: Python dispatches every kernel, every step."""

from __future__ import annotations

from servelab.bench.hf_modes.inputs import random_ids, random_kv


def eager_step(model, batch: int, new_tokens: int, context: int, *, seed: int = 0):
    """Return ``(fn, before_each)``: ``fn()`` runs one step; ``before_each()`` restores the cache to ``context``.

    The cache is a ``DynamicCache`` holding ``context`` random tokens. HF appends to it with ``torch.cat``
    on every step; that reallocation is part of what eager decoding costs, so it is timed.
    """
    import torch
    from transformers import DynamicCache

    gen = torch.Generator(device=model.device).manual_seed(seed)
    ids = random_ids(model, batch, new_tokens, gen)
    kv = random_kv(model, batch, context, gen) if context else None
    pos = torch.arange(context, context + new_tokens, device=model.device).expand(batch, -1)
    state = {}

    def reset():
        cache = DynamicCache(config=model.config)
        if kv is not None:
            for i, (k, v) in enumerate(kv):
                cache.update(k, v, i)
        state["cache"] = cache

    @torch.inference_mode()
    def fn():
        return model(
            input_ids=ids, position_ids=pos, past_key_values=state["cache"], use_cache=True, logits_to_keep=1
        ).logits

    reset()
    return fn, reset
