"""HF forward with a StaticCache, captured once in a CUDA graph and replayed.

Replay removes Python and launch overhead: what remains is the kernels HF's model code issues.
The static cache spans exactly ``context + new_tokens`` slots, so attention reads what a real step reads.
"""

from __future__ import annotations

from servelab.bench.hf_modes.inputs import random_ids


def static_step(model, batch: int, new_tokens: int, context: int, *, seed: int = 0):
    """Return ``(step, rewind, cache)`` for one forward over a ``StaticCache`` of ``context + new_tokens`` slots.

    transformers 5.x's static layers write at an internal ``cumulative_length`` counter, not at the
    ``cache_position`` passed in, and advance it on every call (also inside a captured graph). ``rewind()``
    puts the counter back to ``context`` so that every step writes the same slots; without it repeated
    steps run off the end of the cache.
    """
    import torch
    from transformers import StaticCache

    gen = torch.Generator(device=model.device).manual_seed(seed)
    ids = random_ids(model, batch, new_tokens, gen)
    cache_position = torch.arange(context, context + new_tokens, device=model.device)
    pos = cache_position.expand(batch, -1)
    cache = StaticCache(config=model.config, max_cache_len=context + new_tokens)

    def step():
        return model(
            input_ids=ids,
            position_ids=pos,
            cache_position=cache_position,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits

    @torch.inference_mode()  # the counters were created in inference mode; updating them needs it too
    def rewind():
        for layer in cache.layers:
            if getattr(layer, "is_initialized", False) and hasattr(layer, "cumulative_length"):
                layer.cumulative_length.fill_(context)

    def fill_context():
        """The cached context holds random K/V, as a real one holds real values (never time on zeros)."""
        for layer in cache.layers:
            layer.keys.normal_(generator=gen)
            layer.values.normal_(generator=gen)

    step.fill_context = fill_context
    return step, rewind, cache


def cuda_graph_step(model, batch: int, new_tokens: int, context: int, *, seed: int = 0, warmup: int = 2):
    """Return ``(fn, before_each)``: ``fn()`` replays the captured step; ``before_each()`` rewinds the cache."""
    import torch

    if model.device.type != "cuda":
        raise RuntimeError("the cuda_graph mode needs a CUDA device")
    step, rewind, _ = static_step(model, batch, new_tokens, context, seed=seed)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):  # the first call allocates the static cache lazily
                rewind()
                step()
        torch.cuda.current_stream().wait_stream(side)
        step.fill_context()
        rewind()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    torch.cuda.synchronize()

    def fn():
        graph.replay()
        return out

    return fn, rewind
