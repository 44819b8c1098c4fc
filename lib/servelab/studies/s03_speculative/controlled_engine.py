"""Controlled acceptance at the seed's shapes, through the engine's speculative mode: what speculation costs and gains
at α set by hand (issue 21). Study 3's measuring door (``measure.py``) runs this sweep as its ``controlled_*`` parts;
the reporting path's ``tables.controlled_table`` reduces the repeats.

Acceptance needs trained weights; cost needs only the shapes. Each pair is built with random weights of the exact
architectures (``config:``), its draft really drafting, and every proposal overridden
(``speculative.controlled.ControlledDrafts``): with probability α the target's own greedy token, otherwise one it
rejects. Every cost is the real one; acceptance is the α set.

Per pair, one target model serves two engines, each with its own KV pool and graphs: the plain engine and the
speculative mode, built for the largest γ and swept down with ``SpeculativeEngine.set_gamma`` (an engine per γ
would load and capture the 8B target again for each). Per batch: the plain
engine's greedy continuation (the reference, and the warm-up), plain decoding ``controlled_repeats`` times, then
every γ × α as many times, each with fresh acceptance draws (``speculative.controlled.ControlledDrafts``: the draft
runs every round and its proposals are overridden to acceptance α).

What a row holds (the columns the separate driver's rows, in the committed runs, hold; what differs is said):

- ``seconds``: wall time from after the prefill step to the last token (the prefill is untimed in both);
  ``steps`` (plain): the decode steps in it.
- ``rounds``: verify steps; ``seq_rounds``: (sequence, verify step) pairs that drafted; ``accepted``, ``proposed``:
  drafts kept and drafted (``spec_stats``); ``rejections``: sequence-rounds that rejected a draft.
- ``draft_steps``, ``draft_ms``: each draft round runs as many draft steps as its largest k, timed with CUDA events
  around ``DraftModel.propose``; every round, the first included: the draft follows the prompts inside the target's
  prefill step (``DraftModel.follow``, untimed here as the prefill is), so a first round catches up one token as any
  round does. ``draft_first_ms`` is 0 (rows of an earlier commit left the first round out of both, as if it ran the
  prompts, and held it there).
- ``verify_ms``: CUDA-event time of the verify steps; ``agreed``: sequence-rounds where the target, left alone,
  emitted what the controlled draws did (``ControlledDrafts.disagreed``).
- ``host_syncs_per_round``: the most host syncs one engine step made in an audit run
  (``speculative.syncs.HostSyncs``; the engine reads each step's tokens before it schedules the next, so this is
  not the one read a round of the separate driver made, which the committed runs hold).
"""

from __future__ import annotations

import gc
import time

import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.speculative_engine import SpeculativeEngine, load_draft
from servelab.measure.call_timer import CallTimer
from servelab.models import load_model
from servelab.models.native import native_from_hf
from servelab.speculative.config import SpeculativeConfig
from servelab.speculative.controlled import ControlledDrafts
from servelab.speculative.syncs import HostSyncs
from servelab.studies.s03_speculative.sweep import round_steps


def _name(spec: str) -> str:
    return spec.removeprefix("config:")


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def _status(e: BaseException) -> str:
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"error: {type(e).__name__}: {msg}"


class _Budget:
    def __init__(self, seconds):
        self.t0, self.seconds = time.perf_counter(), seconds

    @property
    def over(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.t0 > self.seconds


def pair_config(P: dict) -> EngineConfig:
    """One engine shape for both: every batch's prompts prefill in one step, and a verify step of the largest batch
    at the largest γ fits the step's token budget."""
    gmax, bmax = max(P["controlled_gammas"]), max(P["batches"])
    max_len = P["controlled_prompt_len"] + P["controlled_new_tokens"] + 2 * gmax + 4
    block = 16
    return EngineConfig(
        block_size=block,
        max_num_seqs=bmax,
        max_num_batched_tokens=max(bmax * P["controlled_prompt_len"], bmax * (gmax + 1)),
        max_model_len=max_len,
        num_blocks=bmax * -(-max_len // block) + 8,
        prefix_caching=False,  # repeats of one prompt set would hit the cache and skip their prefill
    )


def load_engines(draft_spec: str, target_spec: str, P: dict, device: str) -> tuple[Engine, SpeculativeEngine]:
    """(plain, speculative) engines over one target model (random weights of the exact shapes for ``config:``
    specs), the speculative one ``max(controlled_gammas)`` wide."""
    cfg = pair_config(P)
    draft = load_draft(draft_spec, dtype=P["dtype"], device=device, seed=1)
    hf = load_model(target_spec, dtype=P["dtype"], device=device, seed=0, load_tokenizer=False).model
    model = native_from_hf(hf, max_positions=cfg.max_model_len)
    del hf
    _free()
    speculative = SpeculativeConfig("draft_model", max(P["controlled_gammas"]), model=draft_spec)
    return Engine(model, cfg), SpeculativeEngine(model, cfg, speculative=speculative, draft=draft)


def _generate(engine: Engine, prompts, n: int, on_added=None) -> tuple[list[list[int]], float, int]:
    """Greedy ``n`` tokens per prompt: (tokens, seconds after the prefill step, steps after it). ``on_added(seqs)``
    runs once the requests are in (a controlled run keys its reference by their ids)."""
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    if on_added is not None:
        on_added(seqs)
    engine.step()  # the prefill (every prompt fits one step: pair_config), untimed
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    t0, steps = time.perf_counter(), 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    sync()
    return [s.output_token_ids for s in seqs], time.perf_counter() - t0, steps


def _speculative_run(spec: SpeculativeEngine, prompts, n: int, reference, alpha: float, seed: int) -> dict:
    """One generation's row fields with drafts controlled to acceptance ``alpha`` (see the module docstring)."""
    s = spec.spec_stats
    before = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_rejections)
    drafts = CallTimer(spec.draft, "propose", spec.device, note=round_steps)
    verifies = CallTimer(spec, "_verify_step", spec.device)
    vocab, controlled = spec.model.shape.vocab, []

    def control(seqs):
        controlled.append(
            ControlledDrafts({s.seq_id: r for s, r in zip(seqs, reference, strict=True)}, alpha, vocab, seed)
        )
        spec.override = controlled[0]

    try:
        tokens, seconds, _ = _generate(spec, prompts, n, control)
    finally:
        spec.override = None
        drafts.remove()
        verifies.remove()
    draft_ms, verify_ms, draft_steps = drafts.ms(), verifies.ms(), drafts.notes
    seq_rounds = s.num_drafts - before[0]
    emitted = sum(len(t) for t in tokens)
    return dict(
        tokens=emitted,
        seconds=seconds,
        tokens_per_s=emitted / seconds,
        rounds=len(verify_ms),
        accepted=s.num_accepted_tokens - before[2],
        proposed=s.num_draft_tokens - before[1],
        rejections=s.num_rejections - before[3],
        draft_steps=sum(draft_steps),
        draft_ms=sum(draft_ms),
        draft_first_ms=0.0,  # every round is in draft_ms
        verify_ms=sum(verify_ms),
        agreed=seq_rounds - controlled[0].disagreed,
        seq_rounds=seq_rounds,
    )


def sync_audit(spec: SpeculativeEngine, prompts, n: int, reference=None, seed: int = 0) -> int:
    """The most host syncs one step of a greedy generation made, prefill left out: controlled at α = 0.8 where a
    ``reference`` is given, else the proposer's own drafts (prompt lookup)."""
    seqs = [spec.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
    if reference is not None:
        vocab = spec.model.shape.vocab
        refs = {s.seq_id: r for s, r in zip(seqs, reference, strict=True)}
        spec.override = ControlledDrafts(refs, 0.8, vocab, seed)
    spec.step()
    most = 0
    try:
        while spec.has_unfinished():
            with HostSyncs(spec.device) as h:
                spec.step()
            most = max(most, h.count)
    finally:
        spec.override = None
    return most


def measure_batch(plain: Engine, spec: SpeculativeEngine, batch: int, P: dict, budget: _Budget, names) -> list[dict]:
    """Every point of one pair at one batch size: the plain engine's greedy continuation (the reference, and its
    warm-up), plain decoding ``controlled_repeats`` times, then every γ × α as many times, each with fresh draws."""
    n, reps, gammas = P["controlled_new_tokens"], P["controlled_repeats"], P["controlled_gammas"]
    vocab = plain.model.shape.vocab
    prompts = _prompts(batch, P["controlled_prompt_len"], vocab, P["seed"] + batch)
    base = dict(target=names[1], draft=names[0], batch=batch)
    reference, _, _ = _generate(plain, prompts, n)  # also the warm-up of the plain engine
    rows = []
    for r in range(reps):
        _, seconds, steps = _generate(plain, prompts, n)
        emitted = batch * n
        rows.append(
            base
            | dict(
                method="plain",
                repeat=r,
                status="ok",
                tokens=emitted,
                seconds=seconds,
                tokens_per_s=emitted / seconds,
                steps=steps,
            )
        )
    spec.set_gamma(max(gammas))
    syncs = sync_audit(spec, prompts, n, reference, P["seed"])  # also the speculative engine's warm-up
    for g in gammas:
        spec.set_gamma(g)
        for a in P["alphas"]:
            for r in range(reps):
                point = base | dict(method="speculative", gamma=g, alpha=a, repeat=r, host_syncs_per_round=syncs)
                if budget.over:
                    rows.append(point | dict(status="skipped: time budget"))
                    continue
                seed = P["seed"] + 1000 * r + 10 * g + int(100 * a)
                rows.append(point | dict(status="ok") | _speculative_run(spec, prompts, n, reference, a, seed))
    return rows


def controlled_sweep(P: dict, device: str, progress: bool = True):
    """Raw rows of every pair × batch × (plain, γ × α) × repeat (``measure_batch``); the time budget stops new points,
    and new pairs, after ``controlled_budget_s``."""
    import pandas as pd
    from tqdm.auto import tqdm

    budget = _Budget(P["controlled_budget_s"])
    rows = []
    bar = tqdm(total=len(P["controlled_pairs"]) * len(P["batches"]), desc="controlled (engine)", disable=not progress)
    for d_spec, t_spec in P["controlled_pairs"]:
        names = (_name(d_spec), _name(t_spec))
        if budget.over:
            rows.append(dict(target=names[1], draft=names[0], status="skipped: time budget"))
            bar.update(len(P["batches"]))
            continue
        try:
            plain, spec = load_engines(d_spec, t_spec, P, device)
        except Exception as e:  # noqa: BLE001 - a pair that does not load is a row, not a dead run
            rows.append(dict(target=names[1], draft=names[0], status=_status(e)))
            bar.update(len(P["batches"]))
            continue
        for b in P["batches"]:
            try:
                rows += measure_batch(plain, spec, b, P, budget, names)
            except Exception as e:  # noqa: BLE001
                rows.append(dict(target=names[1], draft=names[0], batch=b, status=_status(e)))
            bar.update(1)
        del plain, spec
        _free()
    bar.close()
    return pd.DataFrame(rows)
