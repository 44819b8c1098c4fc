"""Prompt lookup's speed in the engine: tokens/s of the plain engine and of the speculative mode with prompt lookup
(``SpeculativeConfig("ngram")``, drafts searched by ``speculative.ngram``) on the same prompts, at the batch sizes
the draft models are measured at.

Prompt lookup needs no draft model, and its acceptance is the text's own: so it is measured on a trained target
(SmolLM2-135M-Instruct, ``smollm2_lookup_speed``) over held-out chat prompts; any target model (the project's model
code) and prompt set go through ``lookup_sweep``. A batch of b takes the first b prompts (cycling when there are
fewer). Each batch: plain decoding once (the reference and the warm-up), one lookup run per γ (the warm-up, each
step's host syncs counted), then plain and every γ ``repeats`` times, interleaved so drifts touch both. Both run
``max_new_tokens`` tokens per sequence, past an end-of-text too (``ignore_eos``), as the controlled curves do, and
both are timed from after the prefill step.

A lookup row: ``rounds`` engine steps after the prefill (each searches for every running sequence);
``seq_rounds`` (sequence, step) pairs; ``asked`` the drafts the step budget allowed; ``proposed``, ``accepted``,
``rejections`` the speculative counters (``spec_stats``); ``propose_ms`` the host time of the search
(``SpeculativeEngine.propose_s``). The reporting path's ``tables.lookup_table`` reduces the repeats: medians, min–max
spreads, α realised. Study 3's measuring door runs this as its ``lookup`` part.
"""

from __future__ import annotations

import time

import pandas as pd
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.speculative_engine import SpeculativeEngine
from servelab.errors import ParameterError
from servelab.speculative.config import SpeculativeConfig
from servelab.speculative.prompt_lookup import PromptLookupProposer
from servelab.studies.s03_speculative.controlled_engine import sync_audit

# held-out chat prompts and answer length of SmolLM2's run (full: the real_acceptance profile's 48 prompts)
PROFILES = {
    "full": dict(n_prompts=48, max_new_tokens=128, batches=[1, 8, 32], gammas=[2, 4, 8], repeats=5),
    "smoke": dict(n_prompts=2, max_new_tokens=4, batches=[1, 2], gammas=[2], repeats=1),
}
BLOCK = 16


def batch_prompts(prompts: list[list[int]], batch: int) -> list[list[int]]:
    """The first ``batch`` prompts, cycling through the set when it has fewer."""
    if not prompts:
        raise ParameterError("give at least one prompt")
    return [prompts[i % len(prompts)] for i in range(batch)]


def lookup_engines(
    model, prompts, *, batches, gammas, max_new_tokens: int, lookup: PromptLookupProposer
) -> tuple[Engine, SpeculativeEngine]:
    """(plain, prompt lookup) engines over one target model: the largest batch's prompts prefill in one step, and a
    step of it verifying the largest γ fits the step's budget."""
    bmax, gmax = max(batches), max(gammas)
    longest = max(map(len, prompts))
    length = -(-(longest + max_new_tokens + gmax + 2) // BLOCK) * BLOCK
    widest = sum(map(len, batch_prompts(prompts, bmax)))
    cfg = EngineConfig(
        block_size=BLOCK,
        max_num_seqs=bmax,
        max_model_len=length,
        max_num_batched_tokens=max(widest, bmax * (gmax + 1)),
        num_blocks=bmax * (length // BLOCK) + 8,
        prefix_caching=False,  # repeats of one prompt set would hit the cache and skip their prefill
    )
    spec = SpeculativeConfig("ngram", gmax, prompt_lookup_max=lookup.max_ngram, prompt_lookup_min=lookup.min_ngram)
    return Engine(model, cfg), SpeculativeEngine(model, cfg, speculative=spec)


def _run(engine: Engine, prompts, n: int) -> dict:
    """Greedy ``n`` tokens per prompt, timed from after the prefill step: tokens, seconds, steps and (sequence, step)
    pairs after it."""
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    engine.step()  # the prefill (every prompt fits one step: lookup_engines), untimed
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    t0, steps, seq_rounds = time.perf_counter(), 0, 0
    while engine.has_unfinished():
        seq_rounds += sum(not s.is_finished for s in seqs)
        engine.step()
        steps += 1
    sync()
    out = [list(s.output_token_ids) for s in seqs]
    return dict(tokens=out, seconds=time.perf_counter() - t0, steps=steps, seq_rounds=seq_rounds)


def _plain_row(run: dict, base: dict, repeat: int) -> dict:
    return base | dict(method="plain", repeat=repeat, tokens=sum(map(len, run["tokens"])), seconds=run["seconds"])


def _lookup_run(spec: SpeculativeEngine, prompts, n: int, base: dict, gamma: int, repeat: int, ref) -> dict:
    s = spec.spec_stats
    before = (s.num_draft_tokens, s.num_accepted_tokens, s.num_rejections, spec.draft_tokens_asked, spec.propose_s)
    run = _run(spec, prompts, n)
    return base | dict(
        method="lookup",
        gamma=gamma,
        repeat=repeat,
        tokens=sum(map(len, run["tokens"])),
        seconds=run["seconds"],
        rounds=run["steps"],
        seq_rounds=run["seq_rounds"],
        accepted=s.num_accepted_tokens - before[1],
        proposed=s.num_draft_tokens - before[0],
        asked=spec.draft_tokens_asked - before[3],
        rejections=s.num_rejections - before[2],
        propose_ms=1e3 * (spec.propose_s - before[4]),
        same_tokens=run["tokens"] == ref,
    )


def measure_lookup_batch(
    plain: Engine, spec: SpeculativeEngine, name: str, prompts, batch: int, gammas, max_new_tokens: int, repeats: int
) -> list[dict]:
    """Raw rows of one batch size: plain decoding and prompt lookup at each γ, ``repeats`` times each."""
    ps = batch_prompts(prompts, batch)
    base = dict(target=name, batch=batch)
    ref = _run(plain, ps, max_new_tokens)["tokens"]  # the reference, and the plain engine's warm-up
    syncs = {}
    for g in gammas:  # also the warm-ups
        spec.set_gamma(g)
        syncs[g] = sync_audit(spec, ps, max_new_tokens)
    rows = []
    for r in range(repeats):
        rows.append(_plain_row(_run(plain, ps, max_new_tokens), base, r))
        for g in gammas:
            spec.set_gamma(g)
            rows.append(_lookup_run(spec, ps, max_new_tokens, base, g, r, ref) | {"host_syncs": syncs[g]})
    return rows


def lookup_sweep(
    model,
    prompts: list[list[int]],
    *,
    name: str = "target",
    batches=(1, 8, 32),
    gammas=(2, 4, 8),
    max_new_tokens: int = 128,
    repeats: int = 5,
    lookup: PromptLookupProposer | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Raw rows (one per batch × method × γ × repeat) of the plain engine and of prompt lookup in the engine's
    speculative mode over ``model`` (the project's model code; ``measure_lookup_batch``); ``tables.lookup_table``
    reduces them."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ParameterError(f"repeats must be a positive integer, got {repeats!r}")
    lookup = lookup or PromptLookupProposer()
    kw = dict(batches=list(batches), gammas=list(gammas), max_new_tokens=max_new_tokens)
    plain, spec = lookup_engines(model, prompts, lookup=lookup, **kw)
    rows = []
    for b in batches:
        t0 = time.perf_counter()
        rows += measure_lookup_batch(plain, spec, name, prompts, b, list(gammas), max_new_tokens, repeats)
        if progress:
            print(f"prompt lookup, batch {b}: {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows)


def smollm2_lookup_speed(
    profile: str, *, device: str = "cpu", lookup: PromptLookupProposer | None = None, seed: int = 0, progress=False
) -> pd.DataFrame:
    """``lookup_sweep`` of SmolLM2-135M-Instruct on the profile's held-out chat prompts (bfloat16 on CUDA,
    float32 on a CPU); the raw rows."""
    from servelab.models.loader import SMOLLM2, load_model
    from servelab.models.native import native_from_hf
    from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat
    from servelab.studies.common.family.train import quiet_transformers

    if profile not in PROFILES:
        raise ParameterError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    P = PROFILES[profile]
    with quiet_transformers():
        lm = load_model(SMOLLM2, dtype="bfloat16" if device == "cuda" else "float32", device=device)
    prompts = encode_chat(lm.tokenizer, chat_prompts("heldout", P["n_prompts"], seed=seed))
    longest = max(map(len, prompts)) + P["max_new_tokens"] + max(P["gammas"]) + 2 * BLOCK
    model = native_from_hf(lm.model, max_positions=longest)
    del lm
    kw = {k: P[k] for k in ("batches", "gammas", "max_new_tokens", "repeats")}
    return lookup_sweep(model, prompts, name="SmolLM2-135M-Instruct", lookup=lookup, progress=progress, **kw)
