"""α of real pairs: how often a proposer's next token is a trained target's own greedy token, over held-out prompts.

Greedy speculative decoding keeps a drafted token exactly when it equals the target's greedy token at that
position, and a draft's i-th proposal only matters when the i − 1 before it were kept, i.e. when the draft saw the
target's own prefix. So one teacher-forced forward of the draft over prompt + the target's greedy answer gives,
at every answer position, whether a proposal there would be kept (``greedy_agreement``); α is the share of kept
positions, and the rounds of any γ follow exactly from the same vector (``rounds``). Prompt lookup proposes from
the context instead of a model: at each position its first copied token, no proposal counting as a miss.

α pools positions over prompts; its 95% interval is a bootstrap over prompts (prompts, not tokens, are the
independent draws: tokens of one answer are correlated). ``real_acceptance`` returns one row per pair; Study 3
places these α on its controlled-acceptance curves, Study 6 beside HF's assisted generation on the same pairs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.speculative.prompt_lookup import PromptLookupProposer

COLUMNS = [
    "pair",
    "alpha",
    "ci_low",
    "ci_high",
    "prompts",
    "draft",
    "target",
    "kind",
    "positions",
    "gamma",
    "tokens_per_round",
    "alpha_rounds",
]


def greedy_agreement(draft, prompt: list[int], reference: list[int]) -> np.ndarray:
    """Bool per answer position: is the draft's argmax, given the prompt and the reference before it, the
    reference token? (One forward of the HF model ``draft`` over prompt + reference.)"""
    import torch

    if not prompt or not reference:
        raise ParameterError("greedy_agreement needs a prompt and a non-empty reference")
    ids = torch.tensor([list(prompt) + list(reference)], dtype=torch.long, device=draft.device)
    with torch.inference_mode():
        logits = draft(input_ids=ids, use_cache=False).logits[0]
    pred = logits[len(prompt) - 1 : -1].argmax(-1).cpu().numpy()  # the logit at p predicts token p + 1
    return pred == np.asarray(reference)


def lookup_agreement(lookup: PromptLookupProposer, prompt: list[int], reference: list[int]) -> np.ndarray:
    """Bool per answer position: is prompt lookup's first copied token, from prompt + the reference before it,
    the reference token? (No match: no proposal, a miss.)"""
    context = list(prompt)
    hits = np.zeros(len(reference), dtype=bool)
    for i, tok in enumerate(reference):
        proposal = lookup.lookup(context, 1)
        hits[i] = bool(proposal) and proposal[0] == tok
        context.append(tok)
    return hits


def rounds(hits: np.ndarray, gamma: int) -> tuple[int, int, int]:
    """Greedy speculative rounds with ``gamma`` drafts over an answer whose per-position agreement is ``hits``:
    (drafts kept, rounds ended by a rejection, rounds). Each round keeps the leading run of hits (at most γ) and
    adds the target's token; the answer's last round may be cut short by its end."""
    if gamma < 1:
        raise ParameterError(f"gamma must be >= 1, got {gamma}")
    n, t = len(hits), 0
    kept = rejected = count = 0
    while t < n:
        k = 0
        while k < gamma and t + k < n and hits[t + k]:
            k += 1
        count += 1
        kept += k
        rejected += int(k < gamma and t + k < n)  # a miss stopped it (not γ, not the end of the answer)
        t += k + 1
    return kept, rejected, count


def bootstrap_ci(hits: list[np.ndarray], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile interval of the pooled α (kept positions / positions) over ``n_boot`` resamples of the prompts."""
    if not hits:
        return float("nan"), float("nan")
    kept = np.array([h.sum() for h in hits], dtype=float)
    size = np.array([len(h) for h in hits], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(hits), size=(n_boot, len(hits)))
    alphas = kept[idx].sum(1) / np.maximum(size[idx].sum(1), 1)
    lo, hi = np.quantile(alphas, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def summarize(
    hits: Mapping[str, list[np.ndarray]],
    *,
    target: str,
    kinds: Mapping[str, str] | None = None,
    gamma: int = 4,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per draft from its per-prompt agreement vectors (see ``COLUMNS``), over the positions a draft can
    propose: every answer position but the first, which the target's prefill emits before any round (the engine
    drafts from its first decode step on, and HF's assistant from its first round after the prefill)."""
    rows = []
    for name, per_prompt in hits.items():
        per_prompt = [np.asarray(h)[1:] for h in per_prompt if len(h) > 1]
        positions = int(sum(len(h) for h in per_prompt))
        kept, rejected, count = np.sum([rounds(h, gamma) for h in per_prompt], axis=0) if per_prompt else (0, 0, 0)
        lo, hi = bootstrap_ci(per_prompt, n_boot=n_boot, seed=seed)
        rows.append(
            dict(
                pair=f"{name} → {target}",
                alpha=float(sum(h.sum() for h in per_prompt) / positions) if positions else float("nan"),
                ci_low=lo,
                ci_high=hi,
                prompts=len(per_prompt),
                draft=name,
                target=target,
                kind=(kinds or {}).get(name, "draft"),
                positions=positions,
                gamma=gamma,
                tokens_per_round=(positions / count) if count else float("nan"),
                alpha_rounds=kept / (kept + rejected) if kept + rejected else float("nan"),
            )
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def real_acceptance(
    drafts: Mapping[str, object],
    prompts: list[list[int]],
    references: list[list[int]],
    *,
    target_name: str,
    kinds: Mapping[str, str] | None = None,
    gamma: int = 4,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """α per pair with its bootstrap 95% interval: DataFrame[pair, alpha, ci_low, ci_high, prompts, …].

    ``drafts``: name → an HF causal LM sharing the target's tokenizer, or a ``PromptLookupProposer``;
    ``references``: the target's greedy answer to each prompt (``studies.common.drafts.generate.continuations``).
    Passing the target itself among the drafts is a check: its α must be ≈ 1 (its own greedy tokens)."""
    if len(prompts) != len(references):
        raise ParameterError(f"{len(prompts)} prompts but {len(references)} references")
    if not prompts:
        raise ParameterError("real_acceptance needs at least one prompt")
    hits = {name: [] for name in drafts}
    for prompt, ref in zip(prompts, references, strict=True):
        if not ref:
            continue
        for name, d in drafts.items():
            hits[name].append(
                lookup_agreement(d, prompt, ref)
                if isinstance(d, PromptLookupProposer)
                else greedy_agreement(d, prompt, ref)
            )
    return summarize(hits, target=target_name, kinds=kinds, gamma=gamma, n_boot=n_boot, seed=seed)


# the real pair's profiles: held-out prompts and answer length (full: ≥ 32 prompts, as the issue asks)
PROFILES = {"full": dict(n_prompts=48, max_new_tokens=128), "smoke": dict(n_prompts=3, max_new_tokens=8)}


def smollm2_acceptance(
    profile: str,
    *,
    device: str = "cpu",
    self_layers: tuple[int, ...] | None = None,
    lookup: PromptLookupProposer | None = None,
    cache_dir=None,
    gamma: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> pd.DataFrame:
    """``real_acceptance`` for SmolLM2-135M-Instruct (the real target) with its distilled drafts, self-drafts of
    ``self_layers`` layers (default: the distilled drafts' sizes, so each pair of equal cost shows what
    distillation adds) and prompt lookup, on the profile's held-out chat prompts. Trains the drafts if they are
    not cached (``studies.common.drafts.distill``, their own budget)."""
    from servelab.models.loader import SMOLLM2, load_model
    from servelab.speculative.self_draft import self_draft
    from servelab.studies.common.drafts.distill import distill_drafts, eos_ids
    from servelab.studies.common.drafts.generate import continuations
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.common.family.train import quiet_transformers

    if profile not in PROFILES:
        raise ParameterError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    sizes = PROFILES[profile]
    dtype = "bfloat16" if device == "cuda" else "float32"
    dd = distill_drafts(SMOLLM2, profile, cache_dir=cache_dir, device=device, progress=progress)
    with quiet_transformers():
        lm = load_model(SMOLLM2, dtype=dtype, device=device)
        drafts = {
            n: load_model(str(p), dtype=dtype, device=device, load_tokenizer=False).model for n, p in dd.drafts.items()
        }
    kinds = dict.fromkeys(drafts, "distilled")
    for k in self_layers if self_layers is not None else dd.recipe.draft_layers:
        drafts[f"self-{k}L"], kinds[f"self-{k}L"] = self_draft(lm.model, k), "self"
    drafts["prompt-lookup"], kinds["prompt-lookup"] = lookup or PromptLookupProposer(), "lookup"
    prompts = encode_chat(lm.tokenizer, chat_prompts("heldout", sizes["n_prompts"], seed=seed))
    eos = eos_ids(lm.model, lm.tokenizer)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else eos[0]
    refs = continuations(lm.model, prompts, sizes["max_new_tokens"], eos_ids=eos, pad_id=pad, progress=progress)
    return real_acceptance(
        drafts, prompts, refs, target_name="SmolLM2-135M-Instruct", kinds=kinds, gamma=gamma, seed=seed
    )
