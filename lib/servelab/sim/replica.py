"""One simulated GPU server: a real ``Scheduler`` (``servelab.engine.policies``) whose steps take the cost
model's time instead of a forward pass.

A step is exactly the engine's: ``schedule()`` picks the batch, the step lasts ``cost.step_ms(batch)``, then
``postprocess()`` appends one (placeholder) token per sampling sequence and finishes the ones at
``max_tokens``. Nothing about scheduling is re-implemented here.

**Fused decode runs.** Most steps of a loaded server are decode-only steps with the same running set; for the
three Study 1 policies the next ``schedule()`` returns the same batch again until a sequence finishes, a KV
block runs out, or a request arrives (shown in ``tests/test_sim_fast_forward.py`` by comparing against
step-by-step runs). The replica then books ``k`` such steps at once: the first through ``postprocess``, the
rest by appending the tokens and reserving their KV slots through the scheduler's own ``_reserve`` and
finishing through its ``_finish_reason`` / ``_finish``. The run is committed lazily, so an arrival routed here
mid-run cuts it at the first step that starts at or after the arrival, as the step-by-step simulation
would. This is what makes an hour at 100 req/s over 8 replicas fit in a minute.
"""

from __future__ import annotations

import numpy as np

from servelab.engine.policies import ChunkedPrefill, EagerContBatch, FCFS
from servelab.engine.scheduler import ScheduledBatch, Scheduler, TokenBudgetScheduler
from servelab.engine.sequence import SamplingParams, Sequence, SequenceStatus
from servelab.kv.block_manager import BlockManager
from servelab.sim.cost_model import StepCostModel
from servelab.sim.records import RequestBook

# Policies whose schedule() repeats a decode-only batch until a finish, a block shortage or an arrival.
# Exact classes: a subclass may schedule differently and is simulated step by step.
FUSABLE = (FCFS, EagerContBatch, ChunkedPrefill, TokenBudgetScheduler)
MAX_RUN_STEPS = 4096   # bounds the arrays of one fused run
SIM_TOKEN = 0          # the token every simulated step "samples" (the simulator's schedulers know no EOS)


class SimBlockManager(BlockManager):
    """The engine's block accounting (allocation, reference counts, frees) without K/V behind it, so that which
    block a sequence gets does not matter, only how many are free:

    - ``slot_mapping`` returns placeholders of the right length, built in C instead of one Python expression
      per token (otherwise the largest cost of simulating long prompts);
    - free blocks are a stack instead of a lowest-id-first heap (the heap keeps a real pool compact; here it
      would only cost two heap operations per block).

    No prefix cache: the simulated prompts are placeholder ids, so a cache would see every prompt as shared.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._free.reverse()   # pop() hands out block 0 first, like the heap

    def slot_mapping(self, seq_id, start: int, end: int) -> list[int]:
        return [-1] * (end - start)

    def _take(self) -> int:
        b = self._free.pop()
        self._ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        self._free.append(b)


class SimSequence(Sequence):
    """A request in the simulator: placeholder prompt ids (the scheduler only counts tokens), ``index`` is its
    row in the trace. The trace was validated as a whole, so the per-token check of ``Sequence`` is skipped."""

    def __init__(self, index: int, prompt_tokens: int, params: SamplingParams, arrival_s: float):
        super().__init__([SIM_TOKEN] * prompt_tokens, params, arrival_s=arrival_s)
        self.index = index

    def __post_init__(self):
        pass


class Replica:
    """One server: a scheduler, a clock driven from outside, and at most one step (or fused run) in flight."""

    def __init__(self, index: int, scheduler: Scheduler, cost: StepCostModel, book: RequestBook, *,
                 fast_forward: bool = True, step_log: list | None = None):
        self.index = index
        self.scheduler = scheduler
        self.cost = cost
        self.book = book
        self.fast_forward = fast_forward and type(scheduler) in FUSABLE
        self.step_log = step_log
        self.outstanding = 0          # routed and not finished (the least-outstanding router reads it)
        self.version = 0              # bumps when the in-flight run's end moves: stale heap entries are skipped
        self.scheduled_wake = False   # a wake-up is queued for an idle replica
        self._batch: ScheduledBatch | None = None
        self._ends: np.ndarray | None = None   # end time (s) of each step of the in-flight run
        self._start_s = 0.0
        self._steps = 0
        self.num_steps = 0

    @property
    def busy(self) -> bool:
        return self._batch is not None

    def add(self, seq: SimSequence) -> None:
        self.scheduler.add(seq)
        self.outstanding += 1

    # ---- stepping -------------------------------------------------------------------------------
    def start(self, t: float) -> float | None:
        """Schedule the next step at ``t``; its end time (s), or None when there is nothing to run."""
        sched = self.scheduler
        while True:
            batch = sched.schedule()
            if batch.items:
                break
            if not batch.preempted:
                if sched.has_unfinished():
                    raise RuntimeError(f"replica {self.index}: scheduler produced no work with {len(sched.waiting)} "
                                       f"waiting and {len(sched.running)} running sequences")
                return None
        pre_tokens = decodes = ctx = 0
        pairs = 0.0
        samplers = []          # sequences that get a token from this step
        for it in batch.items:
            n = it.num_tokens
            seq = it.seq
            if n == 1:
                decodes += 1
                ctx += it.start
                samplers.append(seq)
            else:
                pre_tokens += n
                pairs += n * (it.start + n / 2)
                if it.start + n == seq.num_tokens:
                    samplers.append(seq)
        k = self._run_length(batch) if self.fast_forward and not pre_tokens and not batch.preempted else 1
        if k == 1:
            self._ends = np.array([t + self.cost.step_ms(pre_tokens, pairs, decodes, ctx, len(batch.items)) / 1e3])
        else:
            self._ends = t + np.cumsum(self.cost.decode_run_ms(decodes, ctx, k)) / 1e3
        self._batch, self._start_s, self._steps, self._samplers = batch, t, k, samplers
        if self.step_log is not None:
            self._log = (t, pre_tokens, decodes, len(batch.items), len(sched.waiting), len(batch.preempted))
        return float(self._ends[-1])

    def _run_length(self, batch: ScheduledBatch) -> int:
        """How many identical decode-only steps (this one included) can be booked at once: until the first
        sequence finishes, or while the free KV blocks cover every sequence's growth."""
        sched = self.scheduler
        items = batch.items
        if len(items) != len(sched.running):
            return 1
        k_cap = MAX_RUN_STEPS
        for it in items:
            if it.start == 0 or it.seq.params.stop_token_ids:   # just admitted, or might stop early
                return 1
            left = it.seq.params.max_tokens - len(it.seq.output_token_ids)
            if left < k_cap:
                k_cap = left
        if k_cap <= 1:
            return 1
        bs = sched.bm.block_size
        free = sched.bm.num_free_blocks

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
        if self._batch is None or self._steps == 1:
            return None
        ends = self._ends
        # step j starts at ends[j-1] (step 0 at the run's start); keep the steps starting strictly before
        m = 1 + int(np.searchsorted(ends[:-1], t_arrival, side="left"))
        if m >= self._steps:
            return None
        self._steps = m
        self._ends = ends[:m]
        self.version += 1
        return float(self._ends[-1])

    def complete(self, t: float) -> int:
        """Account for the in-flight run that ended at ``t``: tokens, finishes, freed blocks. Returns how many
        requests finished."""
        batch, ends, k = self._batch, self._ends, self._steps
        self._batch = self._ends = None
        sched, book = self.scheduler, self.book
        t0 = float(ends[0])
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
            times = ends.tolist()
            max_gap = float(np.max(np.diff(ends)))
            extra = k - 1
            pad = [SIM_TOKEN] * extra
            for it in batch.items:
                seq = it.seq
                book.tokens(seq.index, times, max_gap)
                if seq.status is SequenceStatus.FINISHED:
                    raise RuntimeError("a fused decode run finished a sequence before its last step")
                computed = seq.num_tokens + extra - 1   # the last sampled token stays uncomputed
                sched._reserve(seq, computed)           # slots for every computed position; the run length
                seq.output_token_ids += pad             # guaranteed the blocks
                seq.num_computed_tokens = computed
                reason = sched._finish_reason(seq, SIM_TOKEN)
                if reason is not None:
                    sched._finish(seq, reason)
                    book.finish(seq.index, times[-1])
                    finished += 1
        self.outstanding -= finished
        self.num_steps += k
        if self.step_log is not None:
            s, p, d, n, w, pre = self._log
            self.step_log.append((self.index, s, float(ends[-1]), p, d, n, w, pre, k))
        return finished
