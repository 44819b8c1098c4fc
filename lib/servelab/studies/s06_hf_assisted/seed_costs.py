"""HF's cost ratio c at the seed's shapes: the draft's decode ms/token over the target's, in plain ``generate``.

Cost does not depend on the weights' values (same shapes, same kernels, same bytes), so the seed's pairs
(distilgpt2 → gpt2-medium, Qwen2-0.5B → 1.5B) are timed with architecture-exact random weights (``config:``
specs); acceptance, which does depend on them, comes from the real pair. Each model decodes ``tokens`` tokens
after a random prompt, ``repeats`` times after a warm-up; its cost is the median per-token interval.
"""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd

from servelab.studies.s06_hf_assisted.attention_backend import hf_sdpa
from servelab.studies.s06_hf_assisted.clock import per_token_ms
from servelab.studies.s06_hf_assisted.runs import timed_generate

COLUMNS = ["pair", "draft", "target", "draft_ms", "target_ms", "c", "params_ratio", "tokens", "repeats"]


def decode_ms(spec: str, *, device: str, dtype: str, tokens: int, repeats: int, sdpa: str, seed: int = 0):
    """(median decode ms/token of HF plain generate, parameters) of the model ``spec`` (random weights)."""
    import torch

    from servelab.models import load_model

    model = load_model(spec, dtype=dtype, device=device, seed=seed).model
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (32,), generator=g).tolist()
    with hf_sdpa(sdpa):
        timed_generate(model, prompt, min(8, tokens), pad_token_id=0)  # warm-up: kernels chosen, caches allocated
        per = [per_token_ms(*_marks(timed_generate(model, prompt, tokens, pad_token_id=0))) for _ in range(repeats)]
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return float(np.median(np.concatenate(per))), params


def _name(spec: str) -> str:
    return spec.removeprefix("config:")


def _marks(run):
    return run.counts, run.ms


def seed_shape_costs(
    pairs: list[tuple[str, str]],
    *,
    device: str,
    dtype: str,
    tokens: int = 64,
    repeats: int = 3,
    sdpa: str = "default",
) -> pd.DataFrame:
    """One row per (draft spec, target spec): both models' decode ms/token, c and the parameter ratio.
    Each model is loaded, timed and freed in turn (a model shared by two pairs is timed once)."""
    cache: dict[str, tuple[float, int]] = {}
    rows = []
    for draft, target in pairs:
        for spec in (draft, target):
            if spec not in cache:
                cache[spec] = decode_ms(spec, device=device, dtype=dtype, tokens=tokens, repeats=repeats, sdpa=sdpa)
        (d_ms, d_n), (t_ms, t_n) = cache[draft], cache[target]
        rows.append(
            dict(
                pair=f"{_name(draft)} → {_name(target)}",
                draft=draft,
                target=target,
                draft_ms=d_ms,
                target_ms=t_ms,
                c=d_ms / t_ms,
                params_ratio=d_n / t_n,
                tokens=tokens,
                repeats=repeats,
            )
        )
    return pd.DataFrame(rows, columns=COLUMNS)
