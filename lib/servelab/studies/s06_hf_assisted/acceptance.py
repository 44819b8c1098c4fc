"""The draft's greedy agreement with the target: how often the draft's argmax is the target's next token.

Teacher-forced on the target's own greedy output: one forward of the draft over prompt + output, and at
every output position compare the draft's argmax with the token the target chose. Under greedy assisted
decoding a drafted token is accepted exactly when they agree, so this is the per-token acceptance
probability α of the Leviathan model, measured without the assistant's stopping heuristics.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.s06_hf_assisted.runs import hf_eos_ids


def greedy_agreement(draft, prompt: list[int], target_tokens: list[int], hold=()) -> float:
    """Fraction of output positions where the draft's argmax equals the target's greedy token. ``hold``: token ids
    the target could not emit there (its EOS under ``min_new_tokens``), which the draft may not propose either: HF's
    assistant inherits the same rule, so a position where the draft wanted EOS is no miss of assisted decoding."""
    import torch

    if not target_tokens:
        raise ValueError("target_tokens is empty: nothing to agree on")
    ids = torch.tensor([list(prompt) + list(target_tokens)], dtype=torch.long, device=draft.device)
    with torch.inference_mode():
        logits = draft(input_ids=ids, use_cache=False).logits[0]
    # the logit at position p predicts token p + 1: the output starts at len(prompt)
    out = logits[len(prompt) - 1 : -1]
    if len(hold):
        out = out.clone()
        out[:, [t for t in hold if 0 <= t < out.shape[-1]]] = float("-inf")
    pred = out.argmax(-1).cpu().numpy()
    return float(np.mean(pred == np.asarray(target_tokens)))


def alpha_table(models: dict, pairs, prompts: list[list[int]], runs: dict, sdpa: str = "default") -> pd.DataFrame:
    """α of every pair on every prompt where its target's plain run completed (``runs`` as the sweep returns
    them: {(prompt index, job): GenerationRun}); the drafts' forwards use the SDPA kernels ``sdpa`` (see
    ``attention_backend.hf_sdpa``: no cuDNN plan build per new length)."""
    from servelab.studies.s06_hf_assisted.attention_backend import hf_sdpa

    with hf_sdpa(sdpa):
        return _alpha_rows(models, pairs, prompts, runs)


def _alpha_rows(models: dict, pairs, prompts, runs) -> pd.DataFrame:
    rows = []
    for (i, job), run in runs.items():
        if job.method != "plain" or not run.tokens:
            continue
        for p in pairs:
            if p.target == job.target:
                rows.append(
                    dict(
                        prompt=i,
                        pair=p.name,
                        draft=p.draft,
                        target=p.target,
                        tokens=len(run.tokens),
                        # every timed output holds EOS back to its end (min_new_tokens = max_new_tokens)
                        alpha=greedy_agreement(models[p.draft], prompts[i], run.tokens, hf_eos_ids(models[p.target])),
                    )
                )
    return pd.DataFrame(rows, columns=["prompt", "pair", "draft", "target", "tokens", "alpha"])
