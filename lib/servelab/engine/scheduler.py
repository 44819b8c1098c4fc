"""The scheduler: which sequences run in the next step, and how many tokens each.

The interface is all a policy implements and all the engine (or a simulator, with no GPU) calls:

- ``add(seq)``: a request arrives;
- ``schedule() -> ScheduledBatch``: pick the step's work, reserving KV blocks through the
  ``BlockManager``; when blocks run out the policy decides: queue the newcomer, or preempt a running
  sequence (its blocks are freed and it is recomputed later);
- ``postprocess(batch, sampled) -> list[TokenEvent]``: account for the computed tokens, append the
  sampled ones, finish sequences (EOS, stop ids, max_tokens) and free their blocks. An engine that reads
  its sampled tokens a step late calls its two halves apart: ``advance(batch)`` when the step is launched
  (a placeholder token per sampling item), ``accept(seq, token)`` when the token reaches the host.

The bookkeeping every policy shares (admission limits, postprocess, preemption) lives in
``Scheduler``; a policy only writes ``schedule``. With a prefix cache in the block manager, admission
(``_cached_prefix``, ``_admit``) shares the blocks of a request's longest cached prefix and starts its
prefill after them, under every policy; newly computed full blocks are cached as they are scheduled
(admission) and computed (``postprocess``). ``TokenBudgetScheduler`` is the default. The policies
compared in Study 1 (FCFS, EagerContBatch, ChunkedPrefill) are in ``servelab.engine.policies``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from servelab.engine.sequence import PENDING_TOKEN, FinishReason, Sequence, SequenceStatus
from servelab.errors import ParameterError
from servelab.kv.block_manager import BlockManager, OutOfBlocks


@dataclass(slots=True)
class ScheduledSequence:
    """One sequence's share of a step: tokens [start, start + num_tokens) and where their K/V go."""

    seq: Sequence
    start: int  # == seq.num_computed_tokens when scheduled
    num_tokens: int
    slots: list[int]  # pool slot of each of these tokens

    @property
    def samples(self) -> bool:
        """Whether this step ends the sequence's uncomputed tokens, so its last logits give a new token."""
        return self.start + self.num_tokens == self.seq.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1


@dataclass
class ScheduledBatch:
    items: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # sent back to the queue in this step

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)

    @property
    def is_decode_only(self) -> bool:
        return bool(self.items) and all(it.is_decode for it in self.items)

    def __len__(self) -> int:
        return len(self.items)


class TokenEvent(NamedTuple):
    """A token produced for a request, as the engine yields it."""

    seq_id: int
    token_id: int
    finished: bool
    finish_reason: FinishReason | None
    logprobs: object = None  # a TokenLogprob when the request asked for logprobs (``logprobs.py``)


class Scheduler(ABC):
    """Queues, running set and KV blocks; subclasses decide what runs (``schedule``).

    ``chunks_prompts``: whether the policy may split a prompt over several steps. A policy that does not
    (it prefills a whole prompt, or a whole recompute after preemption, in one step) refuses at ``add``
    a request whose tokens could exceed one step's budget, which it could otherwise never schedule.
    """

    chunks_prompts = True

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        eos_token_ids: tuple[int, ...] = (),
    ):
        for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ParameterError(f"{name} must be an integer, got {v!r}")
        if max_num_seqs < 1:
            raise ParameterError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ParameterError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs}) so that every running sequence can decode each step"
            )
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = tuple(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the first to be preempted
        self.num_preemptions = 0

    @property
    def capacity_tokens(self) -> int:
        return self.bm.num_blocks * self.bm.block_size

    def add(self, seq: Sequence) -> None:
        """Queue a request. Refuses one that could never fit the KV pool, even alone."""
        if seq.max_total_tokens > self.capacity_tokens:
            raise ParameterError(
                f"request {seq.seq_id} needs up to {seq.max_total_tokens} tokens of KV cache; "
                f"the pool holds {self.capacity_tokens}"
            )
        if not self.chunks_prompts and seq.max_total_tokens > self.max_num_batched_tokens:
            raise ParameterError(
                f"request {seq.seq_id} may need to prefill up to {seq.max_total_tokens} tokens in "
                f"one step (prompt + max_tokens, on recompute), over max_num_batched_tokens="
                f"{self.max_num_batched_tokens}; {type(self).__name__} does not chunk prompts"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @abstractmethod
    def schedule(self) -> ScheduledBatch:
        """Choose this step's work; an empty batch when nothing can run."""

    def abort(self, seq: Sequence) -> bool:
        """Drop a waiting or running sequence and free its blocks; whether it was still unfinished."""
        if seq.is_finished:
            return False
        self.finish(seq, FinishReason.ABORT)
        return True

    # ---- shared mechanics, public: the simulator drives a real scheduler through them too ----------------
    def reserve_slots(self, seq: Sequence, end: int) -> None:
        """Make sure positions ``[0, end)`` have slots, reserving whole blocks (to the end of ``end``'s block).

        Reserving to the block end allocates exactly the blocks the tokens need, but asks the block
        manager once per block instead of once per token: a decode step of 256 sequences would
        otherwise spend milliseconds in it. Raises ``OutOfBlocks`` with nothing changed.
        """
        have = len(seq.kv_slots)
        if end <= have:
            return
        target = -(-end // self.bm.block_size) * self.bm.block_size
        if have == 0 and seq.seq_id not in self.bm:
            self.bm.allocate(seq.seq_id, target)
            seq.kv_slots = self.bm.slot_mapping(seq.seq_id, 0, target)
        else:
            seq.kv_slots += self.bm.append(seq.seq_id, target - have)

    def reserve(self, seq: Sequence, end: int) -> bool:
        """Reserve slots for positions up to ``end`` if blocks are free (no preemption); whether it did.

        Multi-step decoding uses this to run several decode steps of a scheduled batch at once.
        """
        try:
            self.reserve_slots(seq, end)
        except OutOfBlocks:
            return False
        return True

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks of the prefix cache that hold a waiting sequence's longest cached prefix ([] without a cache).

        The last token is never taken from the cache: the step must compute it to sample the next token. A
        sequence that needs prompt logprobs takes none: they come from the logits of every prompt position.
        """
        if self.bm.prefix_cache is None or seq.needs_prompt_logprobs:
            return []
        return self.bm.match_prefix(seq.token_ids(0, seq.num_tokens - 1))

    def _admit(self, seq: Sequence, num_tokens: int, cached_blocks: list[int] = ()) -> ScheduledSequence:
        """Move a waiting sequence to running: it shares ``cached_blocks`` (its cached prefix, from
        ``_cached_prefix``), and gets blocks for the ``num_tokens`` tokens it computes after them."""
        start = len(cached_blocks) * self.bm.block_size
        end = start + num_tokens
        if cached_blocks:
            target = -(-end // self.bm.block_size) * self.bm.block_size
            self.bm.allocate(seq.seq_id, target, cached_blocks)  # raises OutOfBlocks with nothing changed
            seq.kv_slots = self.bm.slot_mapping(seq.seq_id, 0, target)
        else:
            self.reserve_slots(seq, num_tokens)  # raises OutOfBlocks with nothing changed
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        seq.num_computed_tokens = start
        if self.bm.prefix_cache is not None:
            self.bm.prefix_cache.record_lookup(seq.num_tokens, start)
            # cached now, not after the step: a request admitted later in this step can share these blocks,
            # since every layer writes the whole step's K/V before any attention reads the pool
            self.bm.cache_blocks(seq.seq_id, end, seq.token_ids)
        return ScheduledSequence(seq, start, num_tokens, seq.kv_slots[start:end])

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; it goes to the front of the queue to be recomputed."""
        self.bm.free(seq.seq_id)
        seq.kv_slots = []
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _reserve_or_preempt(self, seq: Sequence, end: int, batch: ScheduledBatch) -> bool:
        """Reserve slots up to ``end`` for a running ``seq``, preempting the newest running sequences while
        blocks are short (recorded in ``batch.preempted``). False if ``seq`` itself was preempted."""
        while True:
            try:
                self.reserve_slots(seq, end)  # raises with nothing changed when blocks run out
                return True
            except OutOfBlocks:
                victim = self.running[-1]  # the newest running sequence gives its blocks back
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    return False

    def _schedule_running_whole(self, batch: ScheduledBatch) -> None:
        """Every running sequence's remaining tokens (one to decode), oldest first, preempting when short of blocks."""
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            start = seq.num_computed_tokens
            n = seq.num_tokens - start
            if self._reserve_or_preempt(seq, start + n, batch):
                batch.items.append(ScheduledSequence(seq, start, n, seq.kv_slots[start : start + n]))

    def _admit_whole(self, batch: ScheduledBatch, budget: int) -> int:
        """Admit waiting sequences in arrival order, each with its whole prompt (or recompute), while the
        running limit, ``budget`` and free blocks allow; the first that does not fit stops admission.
        Returns the budget left."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self._cached_prefix(seq)
            start = len(hit) * self.bm.block_size
            n = seq.num_tokens - start
            if n > budget or not self.bm.can_allocate(start + n, hit):
                break
            batch.items.append(self._admit(seq, n, hit))
            budget -= n
        return budget

    def postprocess(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[TokenEvent]:
        """Advance each scheduled sequence; ``sampled[i]`` is item i's new token (None if it did not sample).

        ``advance`` then ``accept`` for every item that samples: what an engine that reads its tokens one step
        late (async scheduling) does in two halves, a step apart.
        """
        if len(sampled) != len(batch.items):
            raise ValueError(f"need one sampled entry per scheduled item, got {len(sampled)} for {len(batch.items)}")
        token_of = {id(it): tok for it, tok in zip(batch.items, sampled, strict=True)}
        events = []
        for it in self.advance(batch):
            tok = token_of[id(it)]
            if tok is None:
                raise ValueError(f"sequence {it.seq.seq_id} completed its tokens but no token was sampled")
            event = self.accept(it.seq, tok)
            if event is not None:
                events.append(event)
        return events

    def advance(self, batch: ScheduledBatch) -> list[ScheduledSequence]:
        """The first half of ``postprocess``: the step's tokens are computed (their K/V are in the pool).

        Each item that samples gets a placeholder output token (``PENDING_TOKEN``) until ``accept`` gives its
        value, so the next ``schedule`` already sees the token to decode. Items of sequences that finished
        meanwhile (aborted, or stopped by the token of the step before) are skipped. Returns the items that
        sample, in batch order.
        """
        sampling = []
        for it in batch.items:
            seq = it.seq
            if seq.is_finished:
                continue
            samples = it.start + it.num_tokens == seq.num_tokens
            seq.num_computed_tokens = done = it.start + it.num_tokens
            if self.bm.prefix_cache is not None:
                self.bm.cache_blocks(seq.seq_id, done, seq.token_ids)
            if samples:
                seq.output_token_ids.append(PENDING_TOKEN)
                sampling.append(it)
        return sampling

    def accept(self, seq: Sequence, tok: int) -> TokenEvent | None:
        """The second half: ``tok`` replaces ``seq``'s placeholder; the sequence finishes if it stops there.

        None when ``seq`` finished meanwhile (its token is dropped). A sequence preempted since its step ran
        keeps the token and recomputes it with the rest.
        """
        if seq.is_finished:
            return None
        if not seq.output_token_ids or seq.output_token_ids[-1] != PENDING_TOKEN:
            raise ValueError(f"sequence {seq.seq_id} has no token waiting to be accepted")
        seq.output_token_ids[-1] = tok
        reason = self.finish_reason(seq, tok)
        if reason is not None:
            self.finish(seq, reason)
        return TokenEvent(seq.seq_id, tok, reason is not None, reason)

    def finish_reason(self, seq: Sequence, tok: int) -> FinishReason | None:
        """Why ``seq`` stops after appending ``tok`` (a stop id, EOS unless ignored, its length), or None."""
        p = seq.params
        if tok in p.stop_token_ids:
            return FinishReason.STOP
        if not p.ignore_eos and tok in self.eos_token_ids:
            return FinishReason.EOS
        if len(seq.output_token_ids) >= p.max_tokens:
            return FinishReason.LENGTH
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Mark ``seq`` finished for ``reason``, free its blocks and drop it from the running list (or the queue:
        a sequence preempted after its last step ran learns only then that it stopped)."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        if seq.seq_id in self.bm:  # a preempted sequence holds none
            self.bm.free(seq.seq_id)
        seq.kv_slots = []
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


class TokenBudgetScheduler(Scheduler):
    """Continuous batching under a token budget, oldest first.

    Each step: every running sequence gets its next tokens (one to decode, or the next prefill chunk),
    oldest first, while the budget lasts; when a sequence's blocks run out, the newest running
    sequence is preempted (recompute) until it fits. Then waiting requests are admitted first come,
    first served, each with a prefill chunk that fits the remaining budget and the free blocks; the
    first that does not fit stops admission (it queues). No admission in a step that preempted, so a
    preempted sequence is not readmitted at once only to be preempted again.
    """

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            start = seq.num_computed_tokens
            if not self._reserve_or_preempt(seq, start + n, batch):
                continue
            batch.items.append(ScheduledSequence(seq, start, n, seq.kv_slots[start : start + n]))
            budget -= n
        if batch.preempted:
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self._cached_prefix(seq)
            start = len(hit) * self.bm.block_size
            n = min(seq.num_tokens - start, budget)
            if not self.bm.can_allocate(start + n, hit):
                break
            batch.items.append(self._admit(seq, n, hit))
            budget -= n
        return batch
