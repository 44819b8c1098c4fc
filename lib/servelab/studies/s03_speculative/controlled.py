"""Controlled acceptance at the seed's shapes: what speculation costs and gains at α set by hand (issue 21).

Acceptance needs trained weights; cost needs only the shapes. Each pair below is built with random weights of
the exact architectures (``config:``), runs the batched speculative loop (``servelab.spec.batch_decoder``) with
its draft really drafting, and has every proposal overridden (``servelab.spec.controlled``): with probability α
the target's own greedy token, otherwise one it rejects. Every cost is the real one; acceptance is the α set.

For each pair × batch: the target's greedy continuation (the reference, and the warm-up), plain batched decoding
``repeats`` times, then every γ × α ``repeats`` times, each repeat with fresh acceptance draws. A point the time
budget leaves out is a row with its status. The reporting path's ``tables.controlled_table``
reduces the repeats; Study 3's measuring door (``measure.py``) runs this sweep as its ``controlled_*`` parts.
"""

from __future__ import annotations

import gc
import time

import pandas as pd
import torch

from servelab.models import load_model
from servelab.spec.batch_decoder import BatchSpeculation, greedy_decode
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.controlled import ControlledAcceptance
from servelab.spec.syncs import HostSyncs


def _name(spec: str) -> str:
    return spec.removeprefix("config:")


def row_buckets(batches, gammas) -> tuple[list[int], list[int]]:
    """Decode-graph row counts to capture: the target's verify of b·(γ + 1) rows and its plain step of b rows;
    the draft's b rows, and up to 2b (catch-up rows); powers of two between, for batches thinned by finished
    sequences."""
    top_t = max(b * (g + 1) for b in batches for g in gammas)
    pow2 = [1 << i for i in range(12)]
    target = {b * (g + 1) for b in batches for g in gammas} | set(batches) | {p for p in pow2 if p < top_t}
    draft = set(batches) | {2 * b for b in batches} | {p for p in pow2 if p < 2 * max(batches)}
    return sorted(target), sorted(draft)


def load_pair(draft_spec: str, target_spec: str, P: dict, device: str) -> tuple[PagedBatch, PagedBatch]:
    """(target, draft) as two ``PagedBatch`` engines named by their configs (random weights of the exact shapes
    for ``config:`` specs), the HF copies freed."""
    gmax, bmax = max(P["controlled_gammas"]), max(P["batches"])
    max_len = P["controlled_prompt_len"] + P["controlled_new_tokens"] + 2 * gmax + 4
    tb, db = row_buckets(P["batches"], P["controlled_gammas"])
    out = []
    for spec, buckets, seed in ((target_spec, tb, 0), (draft_spec, db, 1)):
        hf = load_model(spec, dtype=P["dtype"], device=device, seed=seed, load_tokenizer=False).model
        out.append(PagedBatch.from_hf(hf, max_len, bmax, buckets, name=_name(spec)))
        del hf
        _free()
    return out[0], out[1]


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def _spec_row(gen) -> dict:
    return dict(
        tokens=gen.num_tokens,
        seconds=gen.seconds,
        tokens_per_s=gen.tokens_per_s,
        rounds=len(gen.rounds),
        accepted=gen.accepted,
        proposed=gen.proposed,
        rejections=gen.rejections,
        draft_steps=gen.draft_steps,
        draft_ms=gen.draft_ms,
        verify_ms=gen.verify_ms,
        agreed=sum(r.agreed for r in gen.rounds),
        seq_rounds=sum(r.active for r in gen.rounds),
    )


def sync_audit(spec: BatchSpeculation, prompts, n: int, controlled: ControlledAcceptance) -> int:
    """The most host syncs any round of one generation made (``HostSyncs``); the loop's design says 1."""
    state = spec.start(prompts, n, controlled)
    most = 0
    while state.active:
        with HostSyncs(spec.target.device) as s:
            spec.round(state)
        most = max(most, s.count)
    spec.finish(state)
    return most


class _Budget:
    def __init__(self, seconds):
        self.t0, self.seconds = time.perf_counter(), seconds

    @property
    def over(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.t0 > self.seconds


def measure_batch(target: PagedBatch, draft: PagedBatch, batch: int, P: dict, budget: _Budget) -> list[dict]:
    """Every point of one pair at one batch size: plain decoding, then γ × α, ``controlled_repeats`` each."""
    n, reps, gammas = P["controlled_new_tokens"], P["controlled_repeats"], P["controlled_gammas"]
    prompts = _prompts(batch, P["controlled_prompt_len"], target.vocab, P["seed"] + batch)
    base = dict(target=target.name, draft=draft.name, batch=batch)
    ref = greedy_decode(target, prompts, n + max(gammas)).tokens  # also the warm-up of the target's graphs
    rows = []
    for r in range(reps):
        gen = greedy_decode(target, prompts, n)
        rows.append(
            base
            | dict(
                method="plain",
                repeat=r,
                status="ok",
                tokens=gen.num_tokens,
                seconds=gen.seconds,
                tokens_per_s=gen.tokens_per_s,
                steps=gen.steps,
            )
        )
    syncs = sync_audit(
        BatchSpeculation(target, draft, max(gammas)),
        prompts,
        n,
        ControlledAcceptance(ref, 0.8, target.vocab, seed=P["seed"]),
    )  # also the draft's warm-up
    for g in gammas:
        spec = BatchSpeculation(target, draft, g)
        for a in P["alphas"]:
            for r in range(reps):
                point = base | dict(method="speculative", gamma=g, alpha=a, repeat=r, host_syncs_per_round=syncs)
                if budget.over:
                    rows.append(point | dict(status="skipped: time budget"))
                    continue
                seed = P["seed"] + 1000 * r + 10 * g + int(100 * a)
                gen = spec.generate(prompts, n, ControlledAcceptance(ref, a, target.vocab, seed=seed))
                rows.append(point | dict(status="ok") | _spec_row(gen))
    return rows


def controlled_sweep(P: dict, device: str, progress: bool = True) -> pd.DataFrame:
    """Raw rows of every pair × batch × (plain, γ × α) × repeat (see ``measure_batch``)."""
    from tqdm.auto import tqdm

    budget = _Budget(P["controlled_budget_s"])
    rows = []
    jobs = [(d, t, b) for d, t in P["controlled_pairs"] for b in P["batches"]]
    bar = tqdm(total=len(jobs), desc="controlled acceptance", disable=not progress, leave=False)
    for d_spec, t_spec in P["controlled_pairs"]:
        if budget.over:  # loading a pair costs time too
            rows.append(dict(target=_name(t_spec), draft=_name(d_spec), status="skipped: time budget"))
            bar.update(len(P["batches"]))
            continue
        try:
            target, draft = load_pair(d_spec, t_spec, P, device)
        except Exception as e:  # noqa: BLE001 — a pair that does not load is a row, not a dead run
            rows.append(dict(target=_name(t_spec), draft=_name(d_spec), status=_status(e)))
            bar.update(len(P["batches"]))
            continue
        for b in P["batches"]:
            try:
                rows += measure_batch(target, draft, b, P, budget)
            except Exception as e:  # noqa: BLE001
                rows.append(dict(target=target.name, draft=draft.name, batch=b, status=_status(e)))
            bar.update(1)
        target.reset()
        draft.reset()
        del target, draft
        _free()
    bar.close()
    return pd.DataFrame(rows)


def _status(e: BaseException) -> str:
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"error: {type(e).__name__}: {msg}"
