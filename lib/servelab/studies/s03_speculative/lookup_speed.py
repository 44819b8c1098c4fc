"""Prompt lookup's speed in the batched loop: tokens/s of plain batched decoding and of prompt lookup
(``servelab.spec.batch_lookup``) on the same prompts, at the batch sizes the draft models are measured at.

Prompt lookup needs no draft model, and its acceptance is the text's own: so it is measured on a trained target
(SmolLM2-135M-Instruct, ``smollm2_lookup_speed``) over held-out chat prompts; any ``PagedBatch`` target and prompt
set go through ``lookup_sweep``. A batch of b takes the first b prompts (cycling when there are fewer). Each batch:
plain decoding once (the reference and the warm-up), one lookup run per γ (the warm-up of its row buckets, each
round's host syncs counted), then plain and every γ ``repeats`` times, interleaved so drifts touch both. Both loops
run ``max_new_tokens`` tokens per sequence, past an end-of-text too (``greedy_decode`` ignores EOS), as the
controlled curves do.
The reporting path's ``tables.lookup_table`` reduces the repeats: medians, min–max spreads, α realised. Study 3's
measuring door runs this as its ``lookup`` part.
"""

from __future__ import annotations

import time

import pandas as pd

from servelab.errors import ParameterError
from servelab.spec.batch_decoder import greedy_decode
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.batch_lookup import BatchLookup
from servelab.spec.prompt_lookup import PromptLookupProposer
from servelab.studies.s03_speculative.controlled import row_buckets, sync_audit

# held-out chat prompts and answer length of SmolLM2's run (full: the real_acceptance profile's 48 prompts)
PROFILES = {
    "full": dict(n_prompts=48, max_new_tokens=128, batches=[1, 8, 32], gammas=[2, 4, 8], repeats=5),
    "smoke": dict(n_prompts=2, max_new_tokens=4, batches=[1, 2], gammas=[2], repeats=1),
}


def batch_prompts(prompts: list[list[int]], batch: int) -> list[list[int]]:
    """The first ``batch`` prompts, cycling through the set when it has fewer."""
    if not prompts:
        raise ParameterError("give at least one prompt")
    return [prompts[i % len(prompts)] for i in range(batch)]


def _plain_row(gen, base: dict, repeat: int) -> dict:
    return base | dict(method="plain", repeat=repeat, tokens=gen.num_tokens, seconds=gen.seconds)


def _lookup_row(gen, base: dict, gamma: int, repeat: int, ref) -> dict:
    return base | dict(
        method="lookup",
        gamma=gamma,
        repeat=repeat,
        tokens=gen.num_tokens,
        seconds=gen.seconds,
        rounds=len(gen.rounds),
        seq_rounds=sum(r.active for r in gen.rounds),
        accepted=gen.accepted,
        proposed=gen.proposed,
        asked=sum(sum(r.asked) for r in gen.rounds),
        rejections=gen.rejections,
        propose_ms=gen.propose_ms,
        same_tokens=gen.tokens == ref,
    )


def measure_lookup_batch(
    target: PagedBatch, prompts, batch: int, gammas, max_new_tokens: int, repeats: int, lookup
) -> list[dict]:
    """Raw rows of one batch size: plain decoding and prompt lookup at each γ, ``repeats`` times each."""
    ps = batch_prompts(prompts, batch)
    base = dict(target=target.name, batch=batch)
    ref = greedy_decode(target, ps, max_new_tokens).tokens  # the reference, and the plain loop's warm-up
    loops = {g: BatchLookup(target, lookup, g) for g in gammas}
    syncs = {g: sync_audit(spec, ps, max_new_tokens, None) for g, spec in loops.items()}  # also the warm-ups
    rows = []
    for r in range(repeats):
        rows.append(_plain_row(greedy_decode(target, ps, max_new_tokens), base, r))
        for g, spec in loops.items():
            rows.append(_lookup_row(spec.generate(ps, max_new_tokens), base, g, r, ref) | {"host_syncs": syncs[g]})
    return rows


def lookup_sweep(
    target: PagedBatch,
    prompts: list[list[int]],
    *,
    batches=(1, 8, 32),
    gammas=(2, 4, 8),
    max_new_tokens: int = 128,
    repeats: int = 5,
    lookup: PromptLookupProposer | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Raw rows (one per batch × method × γ × repeat) of plain batched decoding and of prompt lookup in the
    batched loop (``measure_lookup_batch``); ``tables.lookup_table`` reduces them."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ParameterError(f"repeats must be a positive integer, got {repeats!r}")
    lookup = lookup or PromptLookupProposer()
    rows = []
    for b in batches:
        t0 = time.perf_counter()
        rows += measure_lookup_batch(target, prompts, b, list(gammas), max_new_tokens, repeats, lookup)
        if progress:
            print(f"prompt lookup, batch {b}: {time.perf_counter() - t0:.1f} s")
    target.reset()
    return pd.DataFrame(rows)


def smollm2_lookup_speed(
    profile: str, *, device: str = "cpu", lookup: PromptLookupProposer | None = None, seed: int = 0, progress=False
) -> pd.DataFrame:
    """``lookup_sweep`` of SmolLM2-135M-Instruct on the profile's held-out chat prompts (bfloat16 on CUDA,
    float32 on a CPU); the raw rows."""
    from servelab.models.loader import SMOLLM2, load_model
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.common.family.train import quiet_transformers

    if profile not in PROFILES:
        raise ParameterError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    P = PROFILES[profile]
    with quiet_transformers():
        lm = load_model(SMOLLM2, dtype="bfloat16" if device == "cuda" else "float32", device=device)
    prompts = encode_chat(lm.tokenizer, chat_prompts("heldout", P["n_prompts"], seed=seed))
    buckets, _ = row_buckets(P["batches"], P["gammas"])
    max_len = max(map(len, prompts)) + P["max_new_tokens"] + max(P["gammas"]) + 2
    target = PagedBatch.from_hf(lm.model, max_len, max(P["batches"]), buckets, name="SmolLM2-135M-Instruct")
    del lm
    kw = {k: P[k] for k in ("batches", "gammas", "max_new_tokens", "repeats")}
    return lookup_sweep(target, prompts, lookup=lookup, progress=progress, **kw)
