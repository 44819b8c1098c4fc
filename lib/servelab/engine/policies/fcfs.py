"""FCFS: request-level (static) batching, the way HF ``generate`` serves a batch.

When nothing is running, the oldest waiting requests are admitted together, in arrival order, up to
``max_num_seqs`` (the batch size), ``max_num_batched_tokens`` prompt tokens and the free KV blocks; their
whole prompts are prefilled in one step. The batch then decodes, one token per member per step, until
every member has finished; no request joins meanwhile, however idle the batch has become.

Two departures from a padded ``generate`` batch: a member that finishes leaves the batch (it computes no
padding tokens afterwards), and when KV blocks run out the newest member is preempted by recompute: it
leaves the batch and heads the queue, so it is prefilled again (prompt + the tokens it already has) with
the next batch.
"""

from __future__ import annotations

from servelab.engine.scheduler import ScheduledBatch, Scheduler


class FCFS(Scheduler):
    chunks_prompts = False

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        if self.running:
            self._schedule_running_whole(batch)  # decodes of the current batch only
        else:
            self._admit_whole(batch, self.max_num_batched_tokens)  # a new batch: all its prefills in one step
        return batch
