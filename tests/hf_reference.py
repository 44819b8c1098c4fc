"""What the engine's greedy tokens are checked against: HF's, on tiny models whose outputs vary.

Two traps make an exactness test pass without checking much:
- At the loader's init (std 0.02) a random tiny model emits one token over and over (tiny-qwen2 and tiny-gpt2
  repeat one token for every prompt), so an engine that got attention wrong would still match. ``varied`` draws
  every matrix at std 0.1, where the continuations move from token to token.
- ``generate(min_new_tokens=n)`` masks EOS until the n-th token, while ``ignore_eos`` (vLLM's, and the engine's)
  only keeps going past it: where EOS is the argmax the two part (tiny-gpt2 at std 0.1 picks its EOS, id 0, as
  the third token of a 2-token prompt). ``hf_greedy`` turns EOS off instead, so HF's greedy is the plain argmax.
"""

from __future__ import annotations

import torch

from servelab.models import load_model

STD = 0.1


def varied(name: str, seed: int = 0, std: float = STD):
    """``config:<name>``'s HF model with every matrix drawn from N(0, std²) by a seeded generator (norms and
    biases keep their init); tied matrices are one parameter, so they stay tied."""
    model = load_model(f"config:{name}").model
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


@torch.inference_mode()
def hf_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """HF ``generate``'s greedy continuation of each prompt alone, exactly ``n`` tokens, EOS an ordinary token."""
    refs = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert out.shape[1] == len(p) + n, "generate stopped early: EOS was not turned off"
        refs.append(out[0, len(p) :].tolist())
    return refs


def varies(refs: list[list[int]]) -> bool:
    """Whether the references could tell a wrong engine apart: some continuation moves from token to token (a
    short prompt may still settle on one token; at the loader's init every prompt of tiny-qwen2 does)."""
    return any(len(set(r)) > 1 for r in refs)
