"""HF forward with a StaticCache, captured once in a CUDA graph and replayed.

Replay removes Python and launch overhead: what remains is the kernels HF's model code issues.
The static cache spans exactly ``context + new_tokens`` slots, so attention reads what a real step reads.
"""

from __future__ import annotations

from servelab.hf_modes.inputs import random_ids


def cuda_graph_step(model, batch: int, new_tokens: int, context: int, *, seed: int = 0, warmup: int = 2):
    """Return ``(fn, None)`` where ``fn()`` replays the captured step."""
    import torch
    from transformers import StaticCache

    if model.device.type != "cuda":
        raise RuntimeError("the cuda_graph mode needs a CUDA device")
    gen = torch.Generator(device=model.device).manual_seed(seed)
    ids = random_ids(model, batch, new_tokens, gen)
    cache_position = torch.arange(context, context + new_tokens, device=model.device)
    pos = cache_position.expand(batch, -1)
    cache = StaticCache(config=model.config, max_cache_len=context + new_tokens)

    def step():
        return model(input_ids=ids, position_ids=pos, cache_position=cache_position, past_key_values=cache,
                     use_cache=True, logits_to_keep=1).logits

    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):  # lazily allocates the static cache, then warms kernels
                step()
        torch.cuda.current_stream().wait_stream(side)
        # the cached context holds random K/V, as a real one holds real values (never time on zeros)
        for layer in cache.layers:
            layer.keys.normal_(generator=gen)
            layer.values.normal_(generator=gen)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    torch.cuda.synchronize()

    def fn():
        graph.replay()
        return out

    return fn, None
