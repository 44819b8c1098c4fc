"""A target's continuations of many prompts at once: batched ``generate`` with left padding.

Greedy continuations are what greedy speculative decoding must reproduce, so they are the distillation data and
the reference that acceptance is measured against; sampled ones (``temperature`` > 0) add variety to the data.
Each continuation stops after its first end-of-turn token (kept: a draft must learn to end too) or at
``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable


def continuations(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    eos_ids: Iterable[int],
    pad_id: int,
    batch_size: int = 32,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = False,
) -> list[list[int]]:
    """The new tokens of each prompt (greedy for ``temperature`` 0), cut after the first token in ``eos_ids``."""
    import torch
    from tqdm.auto import tqdm

    eos = set(int(e) for e in eos_ids)
    out: list[list[int]] = []
    starts = range(0, len(prompts), batch_size)
    for s in tqdm(starts, desc="target generations", disable=not progress, leave=False):
        chunk = prompts[s : s + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):  # left padding: every prompt ends where generation begins
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kw = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(eos))
        if temperature > 0:
            torch.manual_seed(seed + s)
            kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False, num_beams=1)
        with torch.inference_mode():
            gen = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), **kw)
        for row in gen[:, width:].tolist():
            out.append(_cut(row, eos))
    return out


def _cut(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens
