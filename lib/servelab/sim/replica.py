"""One simulated GPU server: a real ``Scheduler`` (``servelab.engine.policies``) whose steps take the cost
model's time instead of a forward pass.

A step is exactly the engine's: ``schedule()`` picks the batch, the step lasts ``cost.step_ms(batch)``, then
``postprocess()`` appends one (placeholder) token per sampling sequence and finishes the ones at
``max_tokens``. Nothing about scheduling is re-implemented here, but for the one pattern the fast path's decode
runs rely on (stated and tested in ``servelab.sim.decode_run``).

**Fast forward.** Most steps of a loaded server are decode-only. While nobody waits and every running sequence
is at its decode stage, the replica books the steps up to the next arrival as a ``DecodeRun`` (finishes inside
it included; see ``servelab.sim.decode_run``) without calling ``schedule()``. When someone waits, a decode-only
batch the scheduler picked is repeated until the first finish, a block shortage or an arrival (the first step
through ``postprocess``, the rest by appending the tokens and reserving their KV slots through the scheduler's
own ``reserve_slots``, finishing through its ``finish_reason`` / ``finish``). Runs are committed lazily, so an
arrival routed here mid-run cuts it at the first step that starts at or after the arrival, as the step-by-step
simulation would. A single step the scheduler picked is settled when it starts (see ``Replica.start``).
Every step that admits or preempts goes through the real scheduler, whose Python cost per running sequence
then bounds the simulator's speed (``servelab.studies.s08_simulator.speed`` measures it). ``fast_forward=False``
steps one at a time through ``schedule`` and ``postprocess``: the reference ``tests/test_sim_fast_forward.py``
compares with.
"""

from __future__ import annotations

import math
from bisect import bisect_left

import numpy as np

from servelab.engine.policies import FCFS, ChunkedPrefill, EagerContBatch
from servelab.engine.scheduler import ScheduledBatch, Scheduler, TokenBudgetScheduler
from servelab.engine.sequence import SamplingParams, Sequence, SequenceStatus
from servelab.kv.block_manager import BlockManager, OutOfBlocks
from servelab.sim.cost_model import StepCostModel
from servelab.sim.decode_run import MAX_RUN_STEPS, SIM_TOKEN, DecodeRun
from servelab.sim.records import RequestBook

# Policies whose schedule() repeats a decode-only batch until a finish, a block shortage or an arrival.
# Exact classes: a subclass may schedule differently and is simulated step by step.
FUSABLE = (FCFS, EagerContBatch, ChunkedPrefill, TokenBudgetScheduler)


class SimBlockManager(BlockManager):
    """The engine's KV-block accounting as the schedulers see it, without K/V behind it: how many blocks each
    sequence holds and how many are free. A simulated replica has nothing to address, so block ids, slot
    addresses and reference counts, which the real manager keeps per block in Python, are left out:
    ``allocate``, ``append`` and ``free`` cost O(1) instead of O(blocks) (long prompts hold hundreds), and
    ``slot_mapping`` returns placeholders of the right length, built in C.

    The capacity rules are ``BlockManager``'s: ``ceil(tokens / block_size)`` blocks per sequence, ``OutOfBlocks``
    with nothing changed when they do not fit. ``tests/test_sim_engine_order.py`` checks, against the engine with
    the real manager, that scheduling comes out the same, preemptions included. No prefix cache and no sharing
    (``fork``): the simulated prompts are placeholder ids, so a cache would see every prompt as shared.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._free_count = num_blocks
        self._held: dict = {}  # seq_id -> blocks it holds

    @property
    def num_free_blocks(self) -> int:
        return self._free_count

    def can_allocate(self, num_tokens: int, cached_blocks=()) -> bool:
        if cached_blocks:
            raise ValueError("the simulator's block manager has no prefix cache")
        return -(-num_tokens // self.block_size) <= self._free_count

    def allocate(self, seq_id, num_tokens: int, cached_blocks=()) -> list[int]:
        if cached_blocks:
            raise ValueError("the simulator's block manager has no prefix cache")
        if seq_id in self._held:
            raise ValueError(f"sequence {seq_id!r} already has blocks; append to it or free it first")
        need = self.blocks_needed(num_tokens)
        if need > self._free_count:
            raise OutOfBlocks(need, self._free_count, seq_id)
        self._held[seq_id] = need
        self._tokens[seq_id] = num_tokens
        self._free_count -= need
        return [-1] * need

    def append(self, seq_id, num_new_tokens: int) -> list[int]:
        held, n = self._held[seq_id], self._tokens[seq_id]
        need = -(-(n + num_new_tokens) // self.block_size) - held
        if need > self._free_count:
            raise OutOfBlocks(need, self._free_count, seq_id)
        self._held[seq_id] = held + need
        self._tokens[seq_id] = n + num_new_tokens
        self._free_count -= need
        return [-1] * num_new_tokens

    def free(self, seq_id) -> None:
        self._free_count += self._held.pop(seq_id)
        del self._tokens[seq_id]

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._held

    def num_tokens(self, seq_id) -> int:
        return self._tokens[seq_id]

    def slot_mapping(self, seq_id, start: int, end: int) -> list[int]:
        return [-1] * (end - start)

    def fork(self, src_seq, dst_seq):
        raise NotImplementedError("the simulator's block manager does not share blocks")


class SimSequence(Sequence):
    """A request in the simulator; ``index`` is its row in the trace. Its prompt is placeholder ids (the
    scheduler only counts tokens) unless ``prompt_ids`` are given (a prefix cache compares them). The trace was
    validated as a whole, so the per-token check of ``Sequence`` is skipped.

    Its ``seq_id`` is ``request_id`` (the trace's, unique within it; ``index`` when not given), never the
    engine's process-wide counter: the scheduler's errors then name the trace's request, and two simulations
    in one process give the same records."""

    def __init__(
        self,
        index: int,
        prompt_tokens: int,
        params: SamplingParams,
        arrival_s: float,
        prompt_ids: list[int] | None = None,
        request_id=None,
    ):
        super().__init__(
            [SIM_TOKEN] * prompt_tokens if prompt_ids is None else prompt_ids,
            params,
            seq_id=index if request_id is None else request_id,
            arrival_s=arrival_s,
        )
        self.index = index

    def __post_init__(self):
        pass


def _steps_to_first_finish(items) -> int:
    """Decode steps until the first of ``items`` finishes (at most ``MAX_RUN_STEPS``); 1 when one was just
    admitted or might stop early."""
    k_cap = MAX_RUN_STEPS
    for it in items:
        if it.start == 0 or it.seq.params.stop_token_ids:  # just admitted, or might stop early
            return 1
        left = it.seq.params.max_tokens - len(it.seq.output_token_ids)
        if left < k_cap:
            k_cap = left
    return k_cap


def _composition(batch: ScheduledBatch) -> tuple:
    """What the cost model prices in a step: ``(prefill tokens, decodes, decode context tokens, longest context,
    Σ n·(c + n/2) attention pairs of the chunks, Σ n·c chunk context pairs, the sequences that sample a token)``."""
    pre_tokens = decodes = ctx = longest = 0
    pairs = ctx_pairs = 0.0
    samplers = []  # sequences that get a token from this step
    for it in batch.items:
        n = it.num_tokens
        seq = it.seq
        if it.start > longest:
            longest = it.start
        if n == 1:
            decodes += 1
            ctx += it.start
            samplers.append(seq)
        else:
            pre_tokens += n
            pairs += n * (it.start + n / 2)
            ctx_pairs += n * it.start
            if it.start + n == seq.num_tokens:
                samplers.append(seq)
    return pre_tokens, decodes, ctx, longest, pairs, ctx_pairs, samplers


class Replica:
    """One server: a scheduler, a clock driven from outside, and at most one step (or run of steps) in flight.

    In flight is one of: a step (or a fused run) the scheduler picked, settled at its end (``_batch``); or, in
    fast-forward mode, a ``DecodeRun`` (``_run``), possibly led by one step the scheduler picked and whose
    ``postprocess`` has already been applied (``_lead``, see ``start``)."""

    def __init__(
        self,
        index: int,
        scheduler: Scheduler,
        cost: StepCostModel,
        book: RequestBook,
        *,
        fast_forward: bool = True,
        step_log: list | None = None,
    ):
        self.index = index
        self.scheduler = scheduler
        self.cost = cost
        self.book = book
        self.eager = fast_forward  # settle single steps at their start
        self.fast_forward = fast_forward and type(scheduler) in FUSABLE  # and fuse decode steps
        self.step_log = step_log
        self.outstanding = 0  # routed and not finished (the least-outstanding router reads it)
        self.next_finish_s = math.inf  # no request in flight finishes before this (s): outstanding holds till then
        self._committed = 0  # routed and not finished, but for the finishes of what is in flight
        self.version = 0  # bumps when the in-flight run's end moves: stale heap entries are skipped
        self.scheduled_wake = False  # a wake-up is queued for an idle replica
        self._batch: ScheduledBatch | None = None
        self._ends: list[float] | None = None  # end time (s) of each step of the in-flight ``_batch`` run
        self._steps = 0
        self._lead: tuple | None = None  # (end s, requests it finished, step-log row) of a settled step
        self._run: DecodeRun | None = None  # the in-flight decode run
        self.num_steps = 0

    @property
    def busy(self) -> bool:
        return self._batch is not None or self._run is not None or self._lead is not None

    def add(self, seq: SimSequence) -> None:
        self.scheduler.add(seq)
        self._committed += 1
        self.outstanding += 1

    def sync_outstanding(self, t: float) -> None:
        """Set ``outstanding`` as of ``t``: requests that got their last token in flight, before ``t``, count as
        finished (a step-by-step simulation would have completed them by then). Needed only once ``t`` passes
        ``next_finish_s``."""
        n, nxt = self._committed, math.inf
        lead = self._lead
        if lead is not None and lead[1]:
            if lead[0] < t:
                n -= lead[1]
            else:
                nxt = lead[0]
        if self._run is not None:
            done, after = self._run.finished_before(t)
            n -= done
            nxt = min(nxt, after)
        self.outstanding, self.next_finish_s = n, nxt

    def _in_flight(self, t: float, end: float | None) -> float | None:
        """Bookkeeping when what is in flight changes at ``t``; passes its ``end`` through."""
        self.outstanding, self.next_finish_s = self._committed, -math.inf  # (the next sync sets it)
        return end

    # ---- stepping -------------------------------------------------------------------------------
    def start(self, t: float) -> float | None:
        """Schedule the next step at ``t``; the end (s) of what is now in flight, or None when idle.

        With fast-forward, a decode run is booked when the pattern holds (``DecodeRun.plan``). Otherwise the
        scheduler picks the step; a single step is then settled at once (``postprocess`` at its start, tokens
        booked at its end): until its end nothing can read the scheduler but ``add``, which only queues, and
        the router, which ``sync_outstanding`` serves. A decode run from the step's end follows it when the
        pattern then holds; an arrival before that end cuts the run to nothing."""
        sched = self.scheduler
        if self.fast_forward:
            run = DecodeRun.plan(sched, self.cost, t)
            if run is not None:
                self._run = run
                return self._in_flight(t, run.run_end)
        waiting_before = len(sched.waiting)
        batch = self._schedule()
        if batch is None:
            return None
        pre_tokens, decodes, ctx, longest, pairs, ctx_pairs, samplers = _composition(batch)
        admitted = len(sched.waiting) != waiting_before  # (a prompt whose prefix is cached may admit as one token)
        k = (
            self._run_length(batch)
            if self.fast_forward and not pre_tokens and not batch.preempted and not admitted
            else 1
        )
        # the step-log row but for its end and step count (``simulator.STEP_COLUMNS``; contexts as the engine
        # logs them: Σ n·c of the chunks, Σ (c + 1) of the decodes)
        log = (
            (
                t,
                pre_tokens,
                decodes,
                len(batch.items),
                len(sched.waiting),
                len(batch.preempted),
                int(ctx_pairs),
                ctx + decodes,
            )
            if self.step_log is not None
            else None
        )
        if k == 1:
            # a step with prefill runs one ragged attention kernel and waits for its longest walk over cached keys,
            # a chunk's or a decode's (``StepCostModel``); the cost model ignores it for a decode-only step
            end = t + self.cost.step_ms(pre_tokens, pairs, decodes, ctx, len(batch.items), ctx_pairs, longest) / 1e3
            if self.eager:
                return self._in_flight(t, self._settle(batch, samplers, end, log))
            self._ends = [end]
        else:
            self._ends = (t + np.cumsum(self.cost.decode_run_ms(decodes, ctx, k, longest)) / 1e3).tolist()
        self._batch, self._steps, self._samplers, self._log = batch, k, samplers, log
        return self._ends[-1]

    def _schedule(self) -> ScheduledBatch | None:
        """The scheduler's next batch with work in it (steps that only preempt are passed over), or None when
        nothing is left to run."""
        sched = self.scheduler
        while True:
            batch = sched.schedule()
            if batch.items:
                return batch
            if not batch.preempted:
                if sched.has_unfinished():
                    raise RuntimeError(
                        f"replica {self.index}: scheduler produced no work with {len(sched.waiting)} "
                        f"waiting and {len(sched.running)} running sequences"
                    )
                return None

    def _settle(self, batch: ScheduledBatch, samplers: list, end: float, log: tuple | None) -> float:
        """Apply a single step now (``postprocess``; its tokens dated ``end``); then book a decode run from
        ``end`` if the pattern holds. The end (s) of what is in flight."""
        sched, book = self.scheduler, self.book
        # postprocess ignores the token of an item that does not sample (a prefill chunk that is not the last)
        sched.postprocess(batch, [SIM_TOKEN] * len(batch.items))
        finished = len(book.step_tokens(samplers, end))
        row = (self.index, log[0], end, *log[1:6], 1, *log[6:]) if log is not None else None
        self._lead = (end, finished, row)
        if self.fast_forward:
            self._run = DecodeRun.plan(sched, self.cost, end)
            if self._run is not None:
                return self._run.run_end
        return end

    def _run_length(self, batch: ScheduledBatch) -> int:
        """How many identical decode-only steps (this one included) can be booked at once: until the first
        sequence finishes, or while the free KV blocks cover every sequence's growth (with a prefix cache:
        without evicting a cached block)."""
        sched = self.scheduler
        items = batch.items
        if len(items) != len(sched.running):
            return 1
        k_cap = _steps_to_first_finish(items)
        if k_cap <= 1:
            return 1
        bs = sched.bm.block_size
        free = sched.bm.num_free_blocks
        if sched.bm.prefix_cache is not None:
            # only truly free blocks: an eviction inside the run would interleave with the blocks the run
            # registers step by step (a chain through an evicted block stops registering), so it must not happen
            free -= sched.bm.prefix_cache.num_evictable

        def blocks(k: int) -> int:  # new blocks the run's steps 1..k-1 need (step 0 reserved its own)
            return sum(max(0, -(-(it.start + k) // bs) - len(it.seq.kv_slots) // bs) for it in items)

        if blocks(k_cap) <= free:
            return k_cap
        lo, hi = 1, k_cap  # blocks(lo) <= free < blocks(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def cut(self, t_arrival: float) -> float | None:
        """A request arrived at ``t_arrival`` during the in-flight run: keep only the steps that start before
        it. The run's new end (s) if it moved, else None."""
        if self._run is not None:
            end = self._run.cut(t_arrival)
            if end is not None:
                self.version += 1
            return end
        if self._batch is None or self._steps == 1:  # (a settled single step cannot be cut)
            return None
        ends = self._ends
        # step j starts at ends[j-1] (step 0 at the run's start); keep the steps starting strictly before
        m = 1 + bisect_left(ends, t_arrival, 0, len(ends) - 1)
        if m >= self._steps:
            return None
        self._steps = m
        del ends[m:]
        self.version += 1
        return ends[-1]

    def complete(self, t: float) -> int:
        """Account for the in-flight run that ended at ``t``: tokens, finishes, freed blocks. Returns how many
        requests finished."""
        settled = self._lead is not None or self._run is not None  # (else a step the scheduler picked)
        finished = self._complete_run() if settled else self._complete_batch()
        self._committed -= finished
        self.outstanding, self.next_finish_s = self._committed, math.inf
        return finished

    def _complete_run(self) -> int:
        """Commit the settled lead step and the decode run behind it; how many requests finished."""
        finished = 0
        if self._lead is not None:
            _, finished, row = self._lead
            self._lead = None
            self.num_steps += 1
            if row is not None:
                self.step_log.append(row)
        run = self._run
        if run is not None:
            self._run = None
            finished += run.commit(self.scheduler, self.book)
            self.num_steps += run.steps
            if self.step_log is not None:
                self.step_log.extend(run.log_rows(self.index))
        return finished

    def _complete_batch(self) -> int:
        """Apply the scheduler's step (or fused run of ``k`` identical decode steps) that just ended; how many
        requests finished."""
        batch, ends, k = self._batch, self._ends, self._steps
        self._batch = self._ends = None
        sched, book = self.scheduler, self.book
        t0 = ends[0]
        # postprocess ignores the token of an item that does not sample (a prefill chunk that is not the last)
        sched.postprocess(batch, [SIM_TOKEN] * len(batch.items))
        finished = 0
        if k == 1:
            tok = book.token
            for seq in self._samplers:
                tok(seq.index, t0)
                if seq.status is SequenceStatus.FINISHED:
                    book.finish(seq.index, t0)
                    finished += 1
        else:
            finished = self._book_fused(batch, ends, k)
        self.num_steps += k
        if self.step_log is not None:
            s, p, d, n, w, pre, pctx, dctx = self._log
            self.step_log.append((self.index, s, ends[-1], p, d, n, w, pre, k, pctx, dctx))
        return finished

    def _book_fused(self, batch: ScheduledBatch, ends: list[float], k: int) -> int:
        """The last ``k - 1`` steps of a fused decode run (``postprocess`` applied its first): tokens at ``ends``,
        KV slots reserved and finishes made through the scheduler's own methods; how many requests finished."""
        sched, book = self.scheduler, self.book
        max_gap = ends[-1] - ends[-2]  # steps only lengthen within a run: its context grows
        extra = k - 1
        pad = [SIM_TOKEN] * extra
        cache = sched.bm.prefix_cache
        finished = 0
        for it in batch.items:
            seq = it.seq
            book.tokens(seq.index, ends, max_gap)
            if seq.status is SequenceStatus.FINISHED:
                raise RuntimeError("a fused decode run finished a sequence before its last step")
            computed = seq.num_tokens + extra - 1  # the last sampled token stays uncomputed
            sched.reserve_slots(seq, computed)  # slots for every computed position; the run length
            seq.output_token_ids += pad  # guaranteed the blocks
            seq.num_computed_tokens = computed
            if cache is not None:  # what postprocess does after each step
                sched.bm.cache_blocks(seq.seq_id, computed, seq.token_ids)
            reason = sched.finish_reason(seq, SIM_TOKEN)
            if reason is not None:
                sched.finish(seq, reason)
                book.finish(seq.index, ends[-1])
                finished += 1
        return finished
