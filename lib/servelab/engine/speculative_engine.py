"""The engine's speculative mode: running requests draft together and one target step verifies them all.

    engine = SpeculativeEngine.from_spec("config:llama-3-8b", speculative=SpeculativeConfig("draft_model", 4,
                                         model="config:qwen2-0.5b"))
    engine.generate(prompts, SamplingParams(max_tokens=64))      # the plain engine's greedy tokens, in fewer steps

A step schedules as the plain engine does (any policy; prefill chunks, preemption, prefix caching). Then every
decoding sequence whose request asks for nothing beyond temperature, top-p and a seed drafts up to γ tokens:

1. **Slots.** A sequence drafts ``k = min(γ, tokens it may still produce − 1, budget left)`` tokens, and only as many
   as fit the blocks it holds or can get without preempting anyone: the drafts' K/V positions are reserved like any
   other tokens', under the step's token budget (``max_num_batched_tokens``).
2. **Proposals.** Prompt lookup (``speculative.ngram``) on the host, or the draft model's round
   (``draft_model.DraftModel``: one host read for the round).
3. **Verification.** The drafts become provisional tokens of their sequences, and the step runs as a chunk of
   ``k + 1`` tokens over the cached context, with logits at every position (the plain engine keeps only the last).
   ``speculative.rejection.verify`` keeps a prefix of each request's drafts and adds the target's token: greedy
   requests get the target's argmax (the plain engine's tokens, token for token); sampled ones keep the target's
   distribution (Leviathan/Chen), with the draft model's distributions as q, or q one-hot for prompt lookup.
4. **Rollback.** The provisional tokens are replaced by what was emitted; stop tokens, EOS and ``max_tokens``
   inside them end the request there. The sequence's computed tokens are its old ones plus the kept drafts, and
   blocks past them go back to the block manager (``rollback.give_back_tail``), in the draft's pool too.

Steps with nothing to draft (prefill-only steps, requests with logprobs or penalties) are plain steps. Every step
is read before the next is scheduled: speculation needs the emitted tokens to draft again, so the mode runs with
``async_scheduling`` off. A verify step scores each proposing request's γ + 1 positions as rows of their own, so the
target's graphs are captured ``max_num_seqs × (γ + 1)`` rows wide (``graph_rows``).

``spec_stats`` counts drafts and kept drafts as vLLM's speculative metrics do (``server.spec_metrics`` exports
them). ``override`` (``speculative.controlled``) sets the acceptance rate for cost measurements at random weights.
``set_gamma("adaptive")`` gives each request its own γ, grown and shrunk by what it kept (``speculative.gamma``).
``propose_s``, ``rollback_s`` and ``draft_tokens_asked`` are the host's share of the phases that have one, for the
studies' phase tables.

This is the one speculative path: the server serves through it, and Studies 3 and 6 measure through it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.draft_model import DraftModel, Drafts
from servelab.engine.engine import Engine, _Launch, _record, resolve_backend
from servelab.engine.logits_processing import held_stops
from servelab.engine.rollback import give_back_tail
from servelab.engine.sampling import sample_step, top_p_filter
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence, TokenEvent
from servelab.engine.sequence import PENDING_TOKEN, Sequence
from servelab.engine.step_inputs import build_step_inputs
from servelab.errors import ParameterError
from servelab.kv.pool import KVPool
from servelab.speculative.config import SpeculativeConfig
from servelab.speculative.gamma import AdaptiveGamma, gamma_policy
from servelab.speculative.ngram import propose_ngram
from servelab.speculative.rejection import PLACEHOLDER, Verified, verify
from servelab.speculative.stats import SpecDecodeStats


class SpeculativeEngine(Engine):
    def __init__(
        self,
        model,
        config: EngineConfig | None = None,
        *,
        speculative: SpeculativeConfig,
        draft=None,
        round_graph: bool = False,
        **kw,
    ):
        """``draft``: the draft model (the project's model code, e.g. from ``models.native``) when ``speculative``
        names one; its vocabulary must be the target's. ``round_graph``: chain a greedy round's draft steps after
        the first in one captured graph (``draft_rounds``). Off by default because it measured no faster: on an
        H100 it halves a round's graph launches, yet the round took 3.61/3.82 ms against 3.64/3.67 step by step at
        batch 1 and 5.14/5.08 against 5.00/5.02 ms at batch 8, in two processes each
        (data/dev/nvidia-h100/2026-12-06/spec_engine_rounds_*)."""
        if not isinstance(speculative, SpeculativeConfig):
            raise ParameterError(f"speculative must be a SpeculativeConfig, got {speculative!r}")
        if (speculative.method == "draft_model") != (draft is not None):
            raise ParameterError(f"method {speculative.method!r} needs a draft model exactly when it names one")
        if draft is not None and draft.shape.vocab != model.shape.vocab:
            raise ParameterError(
                f"the draft's vocabulary ({draft.shape.vocab}) is not the target's ({model.shape.vocab})"
            )
        cfg = config or EngineConfig()
        if cfg.decode_steps != 1:
            raise ParameterError("speculative decoding runs one decode step per scheduling round (decode_steps=1)")
        cfg = replace(cfg, async_scheduling=False)
        if draft is not None:
            cfg = _share_memory(model, draft, cfg)
        self.speculative = speculative
        self.gamma = speculative.num_speculative_tokens
        self.spec_stats = SpecDecodeStats(self.gamma)
        # proposals rewritten after the draft ran (``speculative.controlled``: acceptance set, not learned): the
        # step's costs stay the real ones; greedy requests only, since the draft's distributions are not rewritten
        self.override = None
        self._adaptive: AdaptiveGamma | None = None  # a fresh copy per request (``set_gamma("adaptive")``), or None
        self._request_gamma: dict[int, AdaptiveGamma] = {}
        self.propose_s = 0.0  # host time in the proposers (prompt lookup's search; a draft model's launches)
        self.rollback_s = 0.0  # host time giving rejected drafts' blocks back, the draft's included
        self.draft_tokens_asked = 0  # Σ k the budget allowed, before a proposer found fewer (prompt lookup)
        super().__init__(model, cfg, **kw)
        self.draft = None
        if draft is not None:
            self.draft = DraftModel(
                draft,
                num_blocks=self.num_blocks,
                block_size=cfg.block_size,
                max_num_seqs=cfg.max_num_seqs,
                max_model_len=self.max_model_len,
                compile=self.compile_status.startswith("on"),
                cuda_graphs=cfg.cuda_graphs and self.device.type == "cuda",
                backend=self.backend,
                step_graph_sizes=self._catch_up_sizes() if self.num_step_graphs else None,
                prefix_caching=cfg.prefix_caching,
                prefix_eviction=cfg.prefix_eviction,
                fused_rope_kv_write=self.fused_rope_kv_write,
                small_batch=self.small_batch,
                pdl=self.pdl,
            )
            self.draft.eos_token_ids = self.runner.eos_token_ids  # min_tokens holds them back in the draft's draws too
            if round_graph and self.draft.num_graphs:
                self.draft.capture_rounds(self.gamma - 1)

    def set_gamma(self, gamma) -> None:
        """Draft up to ``gamma`` tokens a step from now on, at most the γ the engine was built with (its graphs and
        ``spec_stats`` positions are that wide), between requests: a sweep over γ on one engine, as Study 3's
        sweeps run it, where an engine per γ would load and capture the 8B target again for each.

        ``"adaptive[:initial[:min:max]]"`` (or an ``AdaptiveGamma``): each request starts at ``initial`` and moves
        by what it keeps (``AdaptiveGamma.update``), up to ``max`` (which must fit the engine's width)."""
        most = self.speculative.num_speculative_tokens
        adaptive = isinstance(gamma, AdaptiveGamma) or (isinstance(gamma, str) and gamma.startswith("adaptive"))
        if adaptive:
            policy = gamma_policy(gamma)
            if policy.max_gamma > most:
                raise ParameterError(f"adaptive gamma reaches {policy.max_gamma}, past the engine's width {most}")
            gamma = policy.max_gamma
        elif isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= most:
            raise ParameterError(f"gamma must be an integer from 1 to {most} (the engine's width), got {gamma!r}")
        if self.has_unfinished():
            raise ParameterError("gamma changes between requests, not while any runs")
        self._adaptive = policy if adaptive else None
        self._request_gamma.clear()
        self.gamma = gamma
        rounds = self.draft.rounds if self.draft is not None else None
        if rounds is not None and rounds.steps != gamma - 1:  # the round graph chains γ − 1 steps
            self.draft.capture_rounds(gamma - 1, capture=bool(rounds.graphs))

    @property
    def graph_rows(self) -> int:
        """Rows the target's graphs take: a verify step scores each proposing request's γ + 1 positions as rows of
        their own (each repeats its sequence's block-table row), so ``max_num_seqs × (γ + 1)``, as vLLM sizes its
        graphs when it speculates. Sized for ``max_num_seqs`` alone, a batch-8 verify step (40 rows at γ = 4) ran
        eagerly on the H100, at 2.1× a plain decode step."""
        return self.config.max_num_seqs * (self.speculative.num_speculative_tokens + 1)

    def _capture_graphs(self, progress) -> None:
        """The plain engine's decode graphs and whole-step graphs (``Engine._capture_graphs``), ``graph_rows`` wide."""
        cfg, r = self.config, self.runner
        rows = self.graph_rows
        self.num_graphs, self.graph_capture_s = 0, 0.0
        if cfg.cuda_graphs and self.device.type == "cuda":
            t0 = time.perf_counter()
            sizes = None if cfg.graph_batch_sizes is None else sorted({*cfg.graph_batch_sizes, rows})
            self.num_graphs = r.capture_cuda_graphs(rows, progress, sizes)
            self.graph_capture_s = time.perf_counter() - t0
        self.num_step_graphs, self.step_graphs_status = 0, "off"
        if cfg.step_graphs and self.device.type == "cuda":
            with wider_step_graphs(r, rows):
                self.step_graphs_status = self._capture_step_graphs(progress)

    def _catch_up_sizes(self) -> list[int]:
        """Token buckets for the draft's whole-step graphs, the target's: its catch-up steps (one or two tokens a
        sequence) and the prefill chunks it follows (up to the target's budget, plus a cached prefix the draft has not
        seen, which runs eagerly when larger)."""
        from servelab.engine.step_graphs import step_graph_sizes

        cfg = self.config
        return list(cfg.step_graph_sizes or step_graph_sizes(cfg.max_num_batched_tokens))

    @classmethod
    def from_spec(
        cls,
        spec: str,
        *,
        speculative: SpeculativeConfig,
        dtype="bfloat16",
        device=None,
        seed: int = 0,
        draft_seed: int | None = None,
        **kw,
    ):
        """Load the draft model ``speculative`` names (first: the target's KV pool then sizes itself from what is
        left), then the target, with the model loader; build the engine. ``draft_seed`` (default ``seed``): the
        draft's random weights where its spec is a ``config:``."""
        draft = None
        if speculative.method == "draft_model":
            s = seed if draft_seed is None else draft_seed
            draft = load_draft(speculative.model, dtype=dtype, device=device, seed=s)
        return super().from_spec(
            spec, dtype=dtype, device=device, seed=seed, speculative=speculative, draft=draft, **kw
        )

    # ---- a step -------------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        for seq in batch.preempted:
            self.runner.release(seq.seq_id)
            if self.draft is not None:
                self.draft.release(seq.seq_id)  # recomputed from scratch: its mirror is too
        if not batch.items:
            if batch.preempted or not self.has_unfinished():
                return []
            raise RuntimeError(
                f"scheduler produced no work with {len(self.scheduler.waiting)} waiting and "
                f"{len(self.scheduler.running)} running sequences"
            )
        plan = self._draft_budget(batch)
        if self.draft is not None:  # what the target computes without drafting, the draft computes beside it
            drafting = {id(it) for it, _ in plan}
            rest = [it for it in batch.items if id(it) not in drafting and it.seq.params.draftable]
            self.draft.follow([it.seq for it in rest], [it.start + it.num_tokens for it in rest])
        drafts = self._propose(plan)
        if self.override is not None and plan:  # host tokens replace the draft's (its costs were paid all the same)
            drafts = Drafts(self.override([it.seq for it, _ in plan], drafts.tokens), drafts.probs)
        proposals = [(it, d, row) for row, ((it, _), d) in enumerate(zip(plan, drafts.tokens, strict=True)) if d]
        events = self._verify_step(batch, proposals, drafts, t0) if proposals else self._plain_step(batch, t0)
        t_back = time.perf_counter()
        for it, _ in plan:  # slots reserved for drafts that were not proposed (or were rejected) go back
            if not it.seq.is_finished:
                give_back_tail(self.block_manager, self.runner.tables, it.seq)
        self.rollback_s += time.perf_counter() - t_back
        return events

    def _gamma_of(self, seq: Sequence) -> int:
        """The most drafts ``seq`` may propose this step: the engine's γ, or its own under an adaptive γ."""
        if self._adaptive is None:
            return self.gamma
        policy = self._request_gamma.get(seq.seq_id)
        if policy is None:
            policy = self._request_gamma[seq.seq_id] = self._adaptive.fresh()
        return policy.gamma

    def _draft_budget(self, batch: ScheduledBatch) -> list[tuple[ScheduledSequence, int]]:
        """``(item, k)`` for each decode item that may draft ``k ≥ 1`` tokens this step, their slots reserved."""
        if any(it.seq.needs_prompt_logprobs or not it.seq.params.draftable for it in batch.items):
            return []  # logprobs and logits processors (but min_tokens) run in plain steps
        left = self.scheduler.max_num_batched_tokens - batch.num_tokens
        out = []
        for it in batch.items:
            seq = it.seq
            if not (it.is_decode and it.samples) or left <= 0:
                continue
            k = min(self._gamma_of(seq), seq.params.max_tokens - len(seq.output_token_ids) - 1, left)
            if k > 0 and not self.scheduler.reserve(seq, it.start + 1 + k):
                k = min(k, len(seq.kv_slots) - it.start - 1)  # what its blocks hold; never preempt for a draft
            if k > 0:
                out.append((it, k))
                left -= k
        return out

    def _propose(self, plan: list[tuple[ScheduledSequence, int]]) -> Drafts:
        """Each planned item's drafts (host lists, possibly shorter than asked, or empty), in ``plan``'s order."""
        if not plan:
            return Drafts([], None)
        t0 = time.perf_counter()
        try:
            return self._proposals(plan)
        finally:
            self.propose_s += time.perf_counter() - t0

    def _proposals(self, plan: list[tuple[ScheduledSequence, int]]) -> Drafts:
        seqs, ks = [it.seq for it, _ in plan], [k for _, k in plan]
        self.draft_tokens_asked += sum(ks)
        if self.draft is not None:
            return self.draft.propose(seqs, ks)
        width = max(s.num_tokens for s in seqs)
        history = torch.full((len(seqs), width), PLACEHOLDER, dtype=torch.long)
        for row, s in enumerate(seqs):
            history[row, : s.num_tokens] = torch.tensor(s.token_ids(0, s.num_tokens))
        cfg = self.speculative
        found, counts = propose_ngram(
            history,
            torch.tensor([s.num_tokens for s in seqs]),
            self.gamma,
            cfg.prompt_lookup_max,
            cfg.prompt_lookup_min,
            limits=torch.tensor(ks),
        )
        return Drafts([row[:c] for row, c in zip(found.tolist(), counts.tolist(), strict=True)], None)

    def _plain_step(self, batch: ScheduledBatch, t0: float) -> list[TokenEvent]:
        """The plain engine's step, read before returning (no drafts anywhere in it)."""
        launched = self.runner.launch(batch)
        self.steps += 1
        self.scheduler.advance(batch)
        self._inflight = launched
        self._launch = _Launch(t0, (time.perf_counter() - t0) * 1e3, len(self.scheduler.waiting), False)
        return self._land()

    @torch.inference_mode()
    def _verify_step(self, batch: ScheduledBatch, proposals: list, drafts: Drafts, t0: float) -> list[TokenEvent]:
        """One target step over ``batch`` in which each proposing item scores its pending token and its drafts.
        ``proposals``: (item, its drafts, its row of ``drafts``) per item that proposed any.

        A proposing item runs as one single-token item per position (``_Scored``): every layer writes the whole
        step's K/V before any attention reads the pool, so position p + j attends to the drafts before it exactly
        as a chunk would, and a step of decodes and drafts stays a decode step, which replays a decode graph
        (``max_num_seqs`` rows at most); a step with prefill chunks replays a whole-step graph, and a step larger
        than every bucket runs eagerly."""
        scored = {}  # id(item) -> its positions' items
        for it, d, _ in proposals:
            seq = it.seq
            seq.output_token_ids += d  # provisional: replaced by what the target emits
            scored[id(it)] = [_Scored(seq, p, 1, [seq.kv_slots[p]]) for p in range(it.start, it.start + 1 + len(d))]
        items = [x for it in batch.items for x in scored.get(id(it), [it])]
        step = ScheduledBatch(items, batch.preempted)
        for src, dst in self.block_manager.take_copies():  # copy-on-write of shared blocks, before any K/V is written
            self.pool.copy_blocks([(src, dst)])
        patch = None
        if drafts.device is not None:  # the drafts' values, still on the device, into their input positions
            where = {id(x): (r, j - 1) for it, _, r in proposals for j, x in enumerate(scored[id(it)]) if j}
            patch = _DraftPatch(where, drafts.device)
        logits, order = self._scored_logits(items, patch)
        self.steps += 1
        host_ms = (time.perf_counter() - t0) * 1e3
        row = {id(x): i for i, x in enumerate(order)}
        plain = [(it, row[id(it)]) for it in batch.items if id(it) not in scored and it.samples]
        parts = []
        if plain:
            chosen = logits[_on([r for _, r in plain], self.device)]
            parts.append(
                sample_step(chosen, [it.seq for it, _ in plain], self.runner.race, self.runner.eos_token_ids)[0]
            )
        ordered = [(it, d, r, [row[id(x)] for x in scored[id(it)]]) for it, d, r in proposals]
        verified = self._verify(logits, ordered, drafts)
        parts += [verified.tokens.flatten(), verified.emitted]
        t_wait = time.perf_counter()
        host = torch.cat([p.long() for p in parts]).tolist()  # the step's one read of the device
        wait_ms = (time.perf_counter() - t_wait) * 1e3
        plain_tokens, host = host[: len(plain)], host[len(plain) :]
        width, n = self.gamma + 1, len(proposals)
        emitted = host[n * width :]
        rest = ScheduledBatch([it for it in batch.items if id(it) not in scored])
        token_of = {id(it): t for (it, _), t in zip(plain, plain_tokens, strict=True)}
        events = self.scheduler.postprocess(rest, [token_of.get(id(it)) for it in rest.items])
        kept = [host[i * width : i * width + emitted[i]] for i in range(n)]
        if self.override is not None:  # controlled acceptance: the draws decide what is kept, not bf16 near-ties
            kept = [self.override.emitted(it.seq, k) for (it, _, _), k in zip(proposals, kept, strict=True)]
            emitted = [len(k) for k in kept]
        for (it, d, _), k in zip(proposals, kept, strict=True):
            policy = self._request_gamma.get(it.seq.seq_id)
            if policy is not None:
                policy.update(len(k) - 1, len(d))
            events += self._accept_verified(it.seq, it.start, len(d), k)
        self.spec_stats.observe([len(d) for _, d, _ in proposals], emitted)
        self._release_finished(events)
        if self.on_step is not None:
            waiting = len(self.scheduler.waiting)
            self.on_step(_record(step, t0, time.perf_counter(), waiting, 1, host_ms=host_ms, wait_ms=wait_ms))
        return events

    def _scored_logits(self, items: list[ScheduledSequence], patch) -> tuple[torch.Tensor, list[ScheduledSequence]]:
        """``(logits, the items they belong to)`` for every item of ``items`` that samples (every ``_Scored`` one): the
        runner's dispatch (a decode graph, a whole-step graph, else eagerly), with ``patch`` writing the drafts into
        the token ids on the device where they are still there."""
        r = self.runner
        if r.graphs is not None and all(it.num_tokens == 1 for it in items):
            rows = r.tables.rows_for(
                [it.seq.seq_id for it in items], [it.start for it in items], [it.slots[0] for it in items]
            )
            ids = [it.seq.token_at(it.start) for it in items]
            out = r.graphs.run(
                ids, [it.start for it in items], [it.slots[0] for it in items], rows, patch and patch.on(items)
            )
            if out is not None:
                if r.graphs.graphs:  # counted as the runner counts: an uncaptured replay (a CPU) is an eager step
                    r.graph_steps += 1
                else:
                    r.eager_steps += 1
                keep = [i for i, it in enumerate(items) if it.samples]
                if len(keep) < len(items):  # a one-token prefill chunk that does not finish its prompt
                    out = out[_on(keep, out.device)]
                return out, [items[i] for i in keep]
        if r.step_graphs is not None:
            ran = r.step_graphs.run(items, patch and patch.on(items))
            if ran is not None:
                r.step_graph_steps += 1
                return ran
        r.eager_steps += 1
        x = build_step_inputs(ScheduledBatch(items), r.tables, self.device, varlen=r.varlen)
        if patch is not None:
            patch.on(x.ordered_items)(x.input_ids)
        return self.model(x.input_ids, x.positions, x.meta, self.pool, x.logits_indices), x.sampling_items

    def _verify(self, logits: torch.Tensor, ordered: list, drafts: Drafts) -> Verified:
        """``rejection.verify`` over the step's proposing requests (``ordered``: item, its drafts, its row of
        ``drafts``, its logits rows): the unseeded ones in one call, each seeded sampled one with its own generator, so
        that its tokens do not depend on the batch."""
        n, gamma, dev = len(ordered), self.gamma, self.device
        seqs = [it.seq for it, *_ in ordered]
        # one gather: each request's logits rows, padded with its last row (never read past its drafts + 1)
        rows = [r + [r[-1]] * (gamma + 1 - len(r)) for _, _, _, r in ordered]
        target = logits[_on([x for r in rows for x in r], dev)].view(n, gamma + 1, -1)
        target = _hold_stops(target, seqs, [len(d) for _, d, _, _ in ordered], self.runner.eos_token_ids)
        target = _filter_top_p(target, seqs)
        if drafts.device is None:  # host drafts (prompt lookup, controlled), PLACEHOLDER past each count
            tokens = torch.tensor([d + [PLACEHOLDER] * (gamma - len(d)) for _, d, _, _ in ordered], dtype=torch.long)
            tokens = tokens.to(dev, non_blocking=True)
        else:  # the round's tokens (PLACEHOLDER past each count), padded to γ positions
            tokens = _pad_positions(drafts.device[_on([r for _, _, r, _ in ordered], dev)], gamma, PLACEHOLDER)
        num = _on([len(d) for _, d, _, _ in ordered], dev)
        temps = torch.tensor([0.0 if s.params.greedy else s.params.temperature for s in seqs]).to(
            dev, non_blocking=True
        )
        q = None
        if drafts.probs is not None:
            q = _pad_positions(drafts.probs[_on([r for _, _, r, _ in ordered], dev)], gamma)
        all_greedy = all(s.params.greedy for s in seqs)
        seeded = [i for i, s in enumerate(seqs) if s.generator is not None and not s.params.greedy]
        groups = [[i for i in range(n) if i not in seeded]] + [[i] for i in seeded]
        out = Verified(torch.full((n, gamma + 1), PLACEHOLDER, dtype=torch.long, device=dev), num.new_zeros(n))
        for group in groups:
            if not group:
                continue
            g = _on(group, dev)
            gen = seqs[group[0]].generator if group[0] in seeded else None
            v = verify(target[g], tokens[g], num[g], temps[g], all_greedy, None if q is None else q[g], generator=gen)
            out.tokens[g] = v.tokens
            out.emitted[g] = v.emitted
        return out

    # ---- after the read -----------------------------------------------------------------------------
    def _accept_verified(self, seq: Sequence, start: int, num_drafts: int, emitted: list[int]) -> list[TokenEvent]:
        """Replace ``seq``'s provisional drafts by the ``emitted`` tokens, finishing it where one stops it; its computed
        tokens are the pending one and the kept drafts; blocks past them go back."""
        del seq.output_token_ids[len(seq.output_token_ids) - num_drafts :]
        if seq.is_finished:  # aborted meanwhile: nothing lands
            return []
        seq.num_computed_tokens = start + len(emitted)  # the pending token and the kept drafts have K/V
        events = []
        for tok in emitted:
            seq.output_token_ids.append(PENDING_TOKEN)
            ev = self.scheduler.accept(seq, tok)
            events.append(ev)
            if ev.finished:
                return events
        bm = self.block_manager
        if bm.prefix_cache is not None:
            bm.cache_blocks(seq.seq_id, seq.num_computed_tokens, seq.token_ids)
        t0 = time.perf_counter()
        give_back_tail(bm, self.runner.tables, seq)
        if self.draft is not None:
            self.draft.roll_back(seq)
        self.rollback_s += time.perf_counter() - t0
        return events

    # ---- bookkeeping --------------------------------------------------------------------------------
    def _release_finished(self, events: list[TokenEvent]) -> None:
        super()._release_finished(events)
        for ev in events:
            if ev.finished:
                self._request_gamma.pop(ev.seq_id, None)
                if self.draft is not None:
                    self.draft.release(ev.seq_id)

    def abort(self, seq: Sequence) -> bool:
        aborted = super().abort(seq)
        if aborted:
            self._request_gamma.pop(seq.seq_id, None)
            if self.draft is not None:
                self.draft.release(seq.seq_id)
        return aborted

    def leaked(self) -> list[int]:
        held = set(super().leaked())
        if self.draft is not None:
            held |= self.draft.held() - {s.seq_id for s in self.scheduler.running}
        return sorted(held)

    def stats(self) -> dict:
        s = self.spec_stats
        return {
            **super().stats(),
            "speculative": self.speculative.method,
            "num_speculative_tokens": self.gamma,
            "spec_num_drafts": s.num_drafts,
            "spec_num_draft_tokens": s.num_draft_tokens,
            "spec_num_accepted_tokens": s.num_accepted_tokens,
            "spec_accepted_per_position": list(s.per_position),
            "draft_round_graph_rounds": self.draft.round_graph_rounds if self.draft is not None else 0,
        }


@contextmanager
def wider_step_graphs(runner, rows: int):
    """``runner.enable_step_graphs`` sizes its graphs' rows by ``runner.max_num_seqs``; inside this block, by ``rows``
    (the block tables stay ``max_num_seqs`` wide: a verify step's rows repeat its sequences' table rows)."""
    narrow, runner.max_num_seqs = runner.max_num_seqs, rows
    try:
        yield
    finally:
        runner.max_num_seqs = narrow


def load_draft(spec: str, *, dtype="bfloat16", device=None, seed: int = 0):
    """The draft model ``spec`` names (``config:<name>``, a directory, an installed package's model), as the
    project's model code."""
    from servelab.models import load_model
    from servelab.models.native import native_from_hf

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    lm = load_model(spec, dtype=dtype, device=device, seed=seed, load_tokenizer=False)
    model = native_from_hf(lm.model, max_positions=min(4096, _positions(lm.model.config)))
    del lm
    return model


def _positions(config) -> int:
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 4096)


def _share_memory(model, draft, cfg: EngineConfig) -> EngineConfig:
    """On CUDA with the pool sized from free memory: the blocks the target alone would get, split between the target's
    pool and the draft's (each holds the same number of blocks) in proportion to their bytes per block."""
    device = next(model.parameters()).device
    if cfg.num_blocks is not None or device.type != "cuda":
        return cfg
    from servelab.engine.memory import plan_gpu_memory

    plan = plan_gpu_memory(
        model, cfg, Engine._max_model_len(model, cfg), resolve_backend(cfg.attention_backend, device)
    )
    dtype = next(model.parameters()).dtype
    target = KVPool.block_bytes(model.shape, cfg.block_size, dtype)
    mine = KVPool.block_bytes(draft.shape, cfg.block_size, dtype)
    return replace(cfg, num_blocks=max(1, plan.num_blocks * target // (target + mine)))


def _hold_stops(target: torch.Tensor, seqs: list[Sequence], drafted: list[int], eos: tuple[int, ...]) -> torch.Tensor:
    """``min_tokens`` on each request's rows of ``target`` [n, γ + 1, vocab]: ``-inf`` on its stops (its stop ids,
    EOS unless ignored) at each position whose token would be an output before its ``min_tokens``-th. Row j of a
    request that drafted ``drafted[i]`` tokens (appended to its outputs, provisionally) picks output number
    ``len(output_token_ids) - drafted[i] + j``, as ``logits_processing.apply_min_tokens`` counts a plain step's."""
    vocab, width = target.shape[-1], target.shape[1]
    hits = []
    for i, (s, k) in enumerate(zip(seqs, drafted, strict=True)):
        p = s.params
        before = len(s.output_token_ids) - k
        if not p.min_tokens or before >= p.min_tokens:
            continue
        stops = held_stops(p, eos, vocab)
        hits += [(i, j, t) for j in range(min(width, p.min_tokens - before)) for t in stops]
    if hits:
        dev = target.device
        r, j, t = (torch.tensor(x).to(dev, non_blocking=True) for x in zip(*hits, strict=True))
        target.index_put_((r, j, t), torch.tensor(float("-inf"), dtype=target.dtype, device=dev))
    return target


def _filter_top_p(target: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Top-p applied to each sampled request's rows of ``target`` [n, γ + 1, vocab], as logits that ``verify``'s
    softmax at the request's temperature turns back into the filtered distribution (log p · T)."""
    for i, s in enumerate(seqs):
        p = s.params
        if p.greedy or p.top_p >= 1:
            continue
        probs = torch.softmax(target[i].float() / p.temperature, dim=-1)
        probs = top_p_filter(probs, torch.full((probs.shape[0],), p.top_p, device=probs.device))
        target[i] = (probs.log() * p.temperature).to(target.dtype)
    return target


def _pad_positions(x: torch.Tensor, gamma: int, fill=0) -> torch.Tensor:
    """A round's per-position tensor [n, k, …] (k ≤ γ positions run: draft tokens, or distributions) as [n, γ, …],
    ``fill`` past k."""
    if x.shape[1] == gamma:
        return x
    return torch.cat([x, x.new_full((x.shape[0], gamma - x.shape[1], *x.shape[2:]), fill)], dim=1)


class _Scored(ScheduledSequence):
    """One position of a proposing item (its pending token, or a draft): its logits are wanted whether or not it
    ends the sequence's tokens."""

    __slots__ = ()

    @property
    def samples(self) -> bool:
        return True


class _DraftPatch:
    """Writes drafts still on the device into a step's flat token ids: ``where[id(item)] = (row, j)``, the item that
    holds draft j of row ``row`` of ``drafts`` [B, k]."""

    def __init__(self, where: dict[int, tuple[int, int]], drafts: torch.Tensor):
        self.where, self.drafts = where, drafts

    def on(self, order: list[ScheduledSequence]):
        """The patch for ids laid out in ``order`` (one token an item where it matters: the drafts' items are
        single-token): one index copy on the device, no wait."""
        width = self.drafts.shape[1]
        dst, src, q = [], [], 0
        for it in order:
            found = self.where.get(id(it))
            if found is not None:
                dst.append(q)
                src.append(found[0] * width + found[1])
            q += it.num_tokens

        def patch(ids: torch.Tensor) -> None:
            index = torch.tensor([dst, src], dtype=torch.long).to(ids.device, non_blocking=True)
            ids.index_copy_(0, index[0], self.drafts.reshape(-1).index_select(0, index[1]))

        return patch


def _on(values: list[int], device) -> torch.Tensor:
    """A host list of indices on ``device`` without waiting for the GPU."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)
