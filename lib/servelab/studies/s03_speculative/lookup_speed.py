"""Prompt lookup's speed in the batched loop: tokens/s of plain batched decoding and of prompt lookup
(``servelab.spec.batch_lookup``) on the same prompts, at the batch sizes the draft models are measured at.

Prompt lookup needs no draft model, and its acceptance is the text's own: so it is measured on a trained target
(SmolLM2-135M-Instruct, ``smollm2_lookup_speed``) over held-out chat prompts; any ``PagedBatch`` target and prompt
set go through ``lookup_sweep``. A batch of b takes the first b prompts (cycling when there are fewer). Each batch:
plain decoding once (the reference and the warm-up), one lookup run per γ (the warm-up of its row buckets, each
round's host syncs counted), then plain and every γ ``repeats`` times, interleaved so drifts touch both. Both loops
run ``max_new_tokens`` tokens per sequence, past an end-of-text too (``greedy_decode`` ignores EOS), as the
controlled curves do.
``lookup_table`` reduces the repeats: medians, min–max spreads, α realised. ``python -m
servelab.studies.s03_speculative.lookup_speed --profile full`` writes ``03_speculative/lookup_speed.csv``.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.spec import leviathan
from servelab.spec.batch_decoder import greedy_decode
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.batch_lookup import BatchLookup
from servelab.spec.prompt_lookup import PromptLookupProposer
from servelab.studies.s03_speculative.controlled import row_buckets, sync_audit

TABLE_COLUMNS = [
    "target",
    "batch",
    "gamma",
    "tokens_per_s_plain",
    "tokens_per_s_lookup",
    "speedup",
    "speedup_low",
    "speedup_high",
    "tokens_per_s_plain_low",
    "tokens_per_s_plain_high",
    "alpha_realised",  # per-proposal acceptance, a search that ran out counting as a miss (real_acceptance's α)
    "proposed_share",  # drafts proposed over drafts asked: how often the search found something to copy
    "tokens_per_round",  # tokens per sequence-round: what one verify of a sequence bought
    "propose_ms_per_round",  # the host's search, per round of the whole batch
    "same_tokens",  # share of repeats whose tokens equal plain decoding's (1 in float32; bfloat16 may differ)
    "host_syncs_per_round",  # the most host syncs a round made in the warm-up (``HostSyncs``); the design says 1
    "repeats",
]

# held-out chat prompts and answer length of SmolLM2's run (full: the real_acceptance profile's 48 prompts)
PROFILES = {
    "full": dict(n_prompts=48, max_new_tokens=128, batches=[1, 8, 32], gammas=[2, 4, 8], repeats=5),
    "smoke": dict(n_prompts=3, max_new_tokens=8, batches=[1, 3], gammas=[2], repeats=2),
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
    batched loop (``measure_lookup_batch``); ``lookup_table`` reduces them."""
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


def _spread(x: np.ndarray) -> tuple[float, float, float]:
    return float(np.median(x)), float(np.min(x)), float(np.max(x))


def _point(grp: pd.DataFrame, plain: pd.DataFrame) -> dict:
    """One (target, batch, γ): medians over repeats with min–max spreads."""
    tp_plain, tp_lo, tp_hi = _spread((plain.tokens / plain.seconds).to_numpy())
    tps = (grp.tokens / grp.seconds).to_numpy()
    sp, sp_lo, sp_hi = _spread(tps / tp_plain)
    return dict(
        tokens_per_s_plain=tp_plain,
        tokens_per_s_lookup=float(np.median(tps)),
        speedup=sp,
        speedup_low=sp_lo,
        speedup_high=sp_hi,
        tokens_per_s_plain_low=tp_lo,
        tokens_per_s_plain_high=tp_hi,
        alpha_realised=leviathan.alpha_mle(int(grp.accepted.sum()), int(grp.rejections.sum())),
        proposed_share=float(grp.proposed.sum() / grp.asked.sum()),
        tokens_per_round=float(grp.tokens.sum() / grp.seq_rounds.sum()),
        propose_ms_per_round=float(grp.propose_ms.sum() / grp.rounds.sum()),
        same_tokens=float(grp.same_tokens.mean()),
        host_syncs_per_round=int(grp.host_syncs.max()),
        repeats=len(grp),
    )


def lookup_table(raw: pd.DataFrame) -> pd.DataFrame:
    """``lookup_speed.csv``: one row per (target, batch, γ) (``TABLE_COLUMNS``). speedup: the median over repeats
    of lookup's tokens/s over the median plain tokens/s of the same batch (spread: min–max)."""
    if raw.empty or "method" not in raw:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    plain = raw[raw.method == "plain"]
    rows = []
    for (t, b, g), grp in raw[raw.method == "lookup"].groupby(["target", "batch", "gamma"], sort=False):
        base = plain[(plain.target == t) & (plain.batch == b)]
        if not base.empty:
            rows.append(dict(target=t, batch=int(b), gamma=int(g)) | _point(grp, base))
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


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


def main(argv=None) -> None:
    """Time prompt lookup in the batched loop on SmolLM2-135M-Instruct and write
    ``03_speculative/lookup_speed.csv`` (provenance and the raw repeats in ``03_speculative_lookup/``)."""
    import argparse

    from servelab.studies.s03_speculative.part import run_part

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--profile", default="full", choices=sorted(PROFILES))
    args = ap.parse_args(argv)
    params = PROFILES[args.profile] | dict(profile=args.profile)
    run_part(
        "03_speculative_lookup",
        "lookup_raw",
        "lookup_speed",
        params,
        lambda device: smollm2_lookup_speed(args.profile, device=device, progress=True),
        lookup_table,
    )


if __name__ == "__main__":
    main()
