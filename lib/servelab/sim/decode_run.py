"""A run of decode-only steps booked at once, finishes included: the simulator's fast path on a loaded replica.

When nobody is waiting and every running sequence is at its decode stage (its one uncomputed token is the one
sampled last), each Study 1 policy (and the engine's default ``TokenBudgetScheduler``) schedules the same step
again and again: one decode for every running sequence, in running order. A finish only takes its sequence out
of that batch, since nobody waits to take its place; what ends the pattern is an arrival (the next ``schedule()``
may admit it), a shortage of KV blocks (it may preempt) or the last finish. ``DecodeRun.plan`` books all those
steps at once without calling ``schedule()`` for any of them.

**Segments.** Between two finishes the batch is fixed: ``d`` decodes whose total context grows by ``d`` tokens a
step and whose longest sequence grows by one, so the cost model's step times form an arithmetic progression,
``a + b·i`` ms for the segment's ``i``-th step (``b = per_ctx_token · d + per_walk_token``), and the time after
``i`` steps has a closed form, ``T + (a·i + b·i(i−1)/2) / 1000`` s. A run is a handful of segments (one per
distinct finish step), whatever its number of steps, so booking, cutting and committing it cost O(sequences), not
O(steps).

The run is committed lazily (``commit``), so that an arrival routed to the replica mid-run cuts it (``cut``) at
the first step that starts at or after the arrival, exactly where a step-by-step simulation would next call
``schedule()``. Committing does the scheduler's own bookkeeping for the steps kept: slots reserved through its
``reserve_slots``, tokens appended, finishes through its ``finish_reason`` / ``finish``.
``tests/test_sim_fast_forward.py`` checks the outcome against step-by-step simulation (every step through
``schedule`` and ``postprocess``), and ``tests/test_sim_engine_order.py`` against the engine itself.

Conservative on KV blocks: the run is only as long as the blocks free *now* allow (blocks freed by finishes
inside the run are not counted), so a shortage never happens inside it; the run just ends earlier and the
scheduler takes the next step.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from servelab.engine.scheduler import Scheduler
from servelab.sim.cost_model import StepCostModel
from servelab.sim.records import RequestBook

MAX_RUN_STEPS = 4096  # bounds one run (and the token-time lists it builds)
SIM_TOKEN = 0  # the token every simulated step "samples" (the simulator's schedulers know no EOS)


def _at(t: float, a: float, b: float, i: int) -> float:
    """Time (s) after ``i`` steps of ``a + b·l`` ms each (l = 0, 1, …), starting at ``t`` (s)."""
    return t + (a * i + b * (i * (i - 1) // 2)) / 1e3


class DecodeRun:
    """Steps ``0 … steps-1`` of decodes from ``t0`` (s): ``seqs[i]`` decodes in the first ``lefts[i]`` of them
    (then finishes) from context ``starts[i]``. Segment ``g`` covers steps ``first[g] …`` for ``length[g]`` steps
    with ``decodes[g]`` decodes, the ``l``-th lasting ``a[g] + b[g]·l`` ms, from ``t[g]`` to ``end[g]`` (s), and
    ``fin[g]`` sequences get their last token in its last step; its first step reads ``ctx[g]`` cached tokens."""

    __slots__ = (
        "seqs",
        "starts",
        "lefts",
        "t0",
        "steps",
        "first",
        "length",
        "decodes",
        "a",
        "b",
        "t",
        "end",
        "fin",
        "ctx",
        "_fin_end",
        "_fin_cum",
    )

    def __init__(self, seqs, starts, lefts, t0: float, steps: int, segments: list[tuple]):
        self.seqs, self.starts, self.lefts = seqs, starts, lefts
        self.t0, self.steps = t0, steps
        cols = list(zip(*segments, strict=True))
        self.first, self.length, self.decodes, self.a, self.b, self.t, self.end, self.fin, self.ctx = map(list, cols)
        self._fin_end = self._fin_cum = None  # built when first asked (only a load-reading router asks)

    @property
    def run_end(self) -> float:
        return self.end[-1] if self.steps else self.t0

    # ---- planning ---------------------------------------------------------------------------------
    @classmethod
    def plan(cls, sched: Scheduler, cost: StepCostModel, t: float) -> DecodeRun | None:
        """The run that starts at ``t`` on ``sched``, or None when the pattern does not hold (someone waits, a
        sequence is mid-prompt or may stop early, a prefix cache is in use, no block for the first step)."""
        if sched.waiting or not sched.running or sched.bm.prefix_cache is not None:
            return None
        state = _decoding(sched)
        if state is None:
            return None
        seqs, starts, lefts = state
        if min(lefts) < 1:
            return None
        k = min(max(lefts), MAX_RUN_STEPS)
        # a sequence decoding r more tokens needs at most r // block_size + 1 new blocks: when even that total
        # fits, skip counting them
        if sum(lefts) // sched.bm.block_size + len(seqs) > sched.bm.num_free_blocks:
            k = _block_limit(sched, seqs, starts, lefts, k)
            if k < 1:
                return None
        return cls(seqs, starts, lefts, t, k, _segments(cost, t, k, starts, lefts))

    # ---- while in flight ------------------------------------------------------------------------------
    def finished_before(self, t: float) -> tuple[int, float]:
        """How many of the run's sequences received their last token strictly before ``t``, and when the next
        one does (s; infinity if none)."""
        if self._fin_end is None:
            self._fin_end, self._fin_cum = [], [0]
            for e, f in zip(self.end, self.fin, strict=True):
                if f:
                    self._fin_end.append(e)
                    self._fin_cum.append(self._fin_cum[-1] + f)
        i = bisect_left(self._fin_end, t)
        return self._fin_cum[i], (self._fin_end[i] if i < len(self._fin_end) else math.inf)

    def cut(self, t_arrival: float) -> float | None:
        """Keep only the steps that start before ``t_arrival`` (none if it is ``t0`` or earlier); the run's new
        end (s), or None when that keeps them all."""
        if not self.steps:
            return None
        g = bisect_left(self.end, t_arrival)  # the first segment that ends at or after the arrival
        if g >= len(self.end):
            return None
        t, a, b, n = self.t[g], self.a[g], self.b[g], self.length[g]
        # the fewest steps i of segment g after which it is t_arrival or later: solve a·i + b·i(i-1)/2 = x, then
        # settle on the float times themselves (those the run reports)
        x = (t_arrival - t) * 1e3
        if b > 0:
            h = a - b / 2
            i = math.ceil((-h + math.sqrt(max(h * h + 2 * b * x, 0.0))) / b)
        else:
            i = math.ceil(x / a) if a > 0 else n
        i = min(max(i, 0), n)
        while i > 0 and _at(t, a, b, i - 1) >= t_arrival:
            i -= 1
        while i < n and _at(t, a, b, i) < t_arrival:
            i += 1
        m = self.first[g] + i  # steps kept: those that start before the arrival
        if m >= self.steps:
            return None
        self.steps = m
        self._fin_end = self._fin_cum = None
        if m == 0:
            for col in (self.first, self.length, self.decodes, self.a, self.b, self.t, self.end, self.fin, self.ctx):
                col.clear()
            return self.t0
        g = bisect_right(self.first, m - 1) - 1  # the segment holding the last kept step
        del self.first[g + 1 :], self.length[g + 1 :], self.decodes[g + 1 :], self.a[g + 1 :], self.b[g + 1 :]
        del self.t[g + 1 :], self.end[g + 1 :], self.fin[g + 1 :], self.ctx[g + 1 :]
        n = m - self.first[g]
        if n < self.length[g]:
            self.length[g] = n
            self.end[g] = _at(self.t[g], self.a[g], self.b[g], n)
            self.fin[g] = 0  # its finishes were due in its last step, now cut
        return self.end[-1]

    # ---- at its end -------------------------------------------------------------------------------------
    def token_times(self) -> list[float]:
        """End time (s) of every kept step."""
        out = []
        for t, a, b, n in zip(self.t, self.a, self.b, self.length, strict=True):
            out += [_at(t, a, b, i) for i in range(1, n + 1)]
        return out

    def commit(self, sched: Scheduler, book: RequestBook) -> int:
        """Apply the kept steps to the scheduler's sequences and the request book; how many requests finished."""
        m = self.steps
        if not m:
            return 0
        first_token = _at(self.t[0], self.a[0], self.b[0], 1)
        times = self.token_times() if book.token_times is not None else None
        # every sequence's last step is a segment's last: its largest gap between two tokens of the run is the
        # longest step among segments 0 … g (the last step of each, as a segment's steps lengthen), step 0 aside
        seg_of = {}
        gap_ms = 0.0
        for g, (f, n, a, b) in enumerate(zip(self.first, self.length, self.a, self.b, strict=True)):
            if f + n > 1:
                longest = a + b * (n - 1)
                if longest > gap_ms:
                    gap_ms = longest
            seg_of[f + n] = (self.end[g], gap_ms / 1e3)
        finished = 0
        run_tokens, reserve = book.run_tokens, sched.reserve_slots
        for seq, c, r in zip(self.seqs, self.starts, self.lefts, strict=True):
            s = r if r < m else m
            last, gap = seg_of[s]
            run_tokens(seq.index, first_token, last, s, gap, times)
            seq.output_token_ids += [SIM_TOKEN] * s
            seq.num_computed_tokens = c + s
            if s == r:
                reason = sched.finish_reason(seq, SIM_TOKEN)
                if reason is None:
                    raise RuntimeError(f"sequence {seq.seq_id} was planned to finish but has no finish reason")
                sched.finish(seq, reason)  # frees its blocks (its last steps' slots were never reserved)
                book.finish(seq.index, last)
                finished += 1
            elif c + s > len(seq.kv_slots):  # (the plan checked that the free blocks cover it)
                reserve(seq, c + s)
        return finished

    def log_rows(self, replica: int) -> list[tuple]:
        """Step-log rows (``simulator.STEP_COLUMNS``) of the kept steps, one per segment (contexts of its first)."""
        return [
            (replica, t, e, 0, d, d, 0, 0, n, 0, c + d)
            for t, e, d, n, c in zip(self.t, self.end, self.decodes, self.length, self.ctx, strict=True)
        ]


def _decoding(sched: Scheduler) -> tuple[list, list[int], list[int]] | None:
    """The running sequences, each one's context (tokens computed) and decode steps left, when every one is at
    its decode stage and can only stop at ``max_tokens``; None otherwise."""
    eos_stops = SIM_TOKEN in sched.eos_token_ids
    seqs = list(sched.running)
    starts, lefts = [], []
    add_start, add_left = starts.append, lefts.append
    for seq in seqs:
        p = seq.params
        out = len(seq.output_token_ids)
        c = seq.num_computed_tokens
        if (
            len(seq.prompt_token_ids) + out - c != 1
            or SIM_TOKEN in p.stop_token_ids
            or (eos_stops and not p.ignore_eos)
        ):
            return None
        add_start(c)
        add_left(p.max_tokens - out)
    return seqs, starts, lefts


def _segments(cost: StepCostModel, t: float, k: int, starts: list[int], lefts: list[int]) -> list[list]:
    """The run's segments from ``t`` over ``k`` steps (see the module docstring), each
    ``[first step, steps, decodes, a ms, b ms, start s, end s, finishes, context at its first step]``."""
    fixed_ms, per_decode_ms, per_ctx_ms, per_walk_ms = cost.decode_step_terms()
    d, ctx = len(starts), sum(starts)  # decodes, and their total context at step 0
    segments = []
    first, now = 0, t
    # the sequences in finishing order; a segment ends where the next one finishes (or at step k)
    order = sorted(zip(lefts, starts, strict=True))
    # the longest context among the sequences still decoding once the first j have finished
    longest = [0] * (len(order) + 1)
    for j in range(len(order) - 1, -1, -1):
        longest[j] = max(longest[j + 1], order[j][1])
    for j, (left, start) in enumerate(order):
        if left > first and first < k:  # close the segment [first, min(left, k)) before this finish
            stop = left if left < k else k
            n = stop - first
            c = ctx + first * d  # cached tokens the segment's first step reads
            a = fixed_ms + per_decode_ms * d + per_ctx_ms * c + per_walk_ms * (longest[j] + first)
            b = per_ctx_ms * d + per_walk_ms
            end = _at(now, a, b, n)
            segments.append([first, n, d, a, b, now, end, 0, c])
            first, now = stop, end
        if left == first:  # it gets its last token in the segment just closed
            segments[-1][7] += 1
            d -= 1
            ctx -= start
    return segments


def _block_limit(sched: Scheduler, seqs, starts, lefts, k_max: int) -> int:
    """The most steps (≤ ``k_max``) whose new KV blocks fit in the blocks free now (0: not even the first)."""
    bs = sched.bm.block_size
    free = sched.bm.num_free_blocks
    held = [len(s.kv_slots) // bs for s in seqs]

    def blocks(k: int) -> int:  # new blocks steps 0 … k-1 need: positions [0, start + min(k, left)) covered
        return sum(max(0, -(-(c + (k if k < r else r)) // bs) - h) for c, r, h in zip(starts, lefts, held, strict=True))

    if blocks(k_max) <= free:
        return k_max
    lo, hi = 0, k_max  # blocks(lo) <= free < blocks(hi); blocks(0) = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if blocks(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo
