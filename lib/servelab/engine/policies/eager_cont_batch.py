"""EagerContBatch: iteration-level continuous batching with whole-prompt prefills (Orca, vLLM v0).

Scheduling happens every step. If a waiting request can be admitted (running limit ``max_num_seqs``,
its whole prompt within ``max_num_batched_tokens``, blocks for it free), the step is a prefill step: the
waiting requests are admitted in arrival order while they fit, each with its whole prompt, and the
running sequences' decodes pause for that step (a prefill step holds no decodes). Otherwise the step
decodes every running sequence, one token each; when a decode finds no free block, the newest running
sequence is preempted by recompute (it heads the queue and is prefilled again, prompt + outputs).

Newcomers start as early as possible (good mean TTFT, large prefill batches) at the price of stalling
every running decode for a whole prefill: the worst-case decode stall of claim F1.1.
"""

from __future__ import annotations

from servelab.engine.scheduler import ScheduledBatch, Scheduler


class EagerContBatch(Scheduler):
    chunks_prompts = False

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        self._admit_whole(batch, self.max_num_batched_tokens)
        if not batch.items:
            self._schedule_running_whole(batch)
        return batch
