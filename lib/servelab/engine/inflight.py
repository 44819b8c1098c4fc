"""A launched step whose sampled tokens the host has not read yet (async scheduling, as in vLLM V1 and SGLang).

The GPU samples a step's tokens; a non-blocking copy puts them in pinned host memory and an event marks when
they are there. The host meanwhile schedules the next step and builds its inputs: a sequence whose last
token is still on the device (``PENDING_TOKEN`` on the host) takes it from the previous step's device tensor
(``patch_pending``), so the next step launches before the previous one's tokens are read. Reading them
(``InFlightStep.tokens``) is then the step loop's one wait for the GPU, and the GPU runs the next step during
it. The host learns of an EOS one step late: that sequence's work in the next step is thrown away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from servelab.engine.logprobs import PromptLogprobs, SampledLogprobs
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence
from servelab.engine.sequence import PENDING_TOKEN


@dataclass
class InFlightStep:
    """One launched step: its batch, the items that sample (row i of ``device_tokens`` is ``items[i]``'s token)."""

    batch: ScheduledBatch
    items: list[ScheduledSequence]
    device_tokens: torch.Tensor | None  # LongTensor [S] on the device (None when no item samples)
    host_tokens: torch.Tensor | None  # the same tokens in (pinned) host memory once ``ready`` has passed
    ready: object = None  # a torch.cuda.Event recorded after the copy to the host (None on a CPU)
    start: object = None  # timing events around the step's GPU work (CUDA only): its device time
    end: object = None
    row_of: dict = field(default_factory=dict)  # seq_id -> row of its token
    logprobs: SampledLogprobs | None = None  # of the sampled tokens, for the rows that asked
    prompt_logprobs: PromptLogprobs | None = None  # of prompt tokens, for the prefill chunks that asked

    def __post_init__(self):
        self.row_of = {it.seq.seq_id: i for i, it in enumerate(self.items)}

    def tokens(self) -> list[int]:
        """The sampled tokens as Python ints: waits for the GPU to finish this step (the one wait per step)."""
        if self.host_tokens is None:
            return []
        if self.ready is not None:
            self.ready.synchronize()
        return self.host_tokens.tolist()

    def token_logprobs(self) -> list | None:
        """One ``TokenLogprob`` (or None) per sampling row, or None when no row asked (reads the device)."""
        return None if self.logprobs is None else self.logprobs.per_row(len(self.items))

    def land_prompt_logprobs(self) -> None:
        """Hand the prompt logprobs this step computed to their sequences (reads the device)."""
        if self.prompt_logprobs is not None:
            self.prompt_logprobs.land()

    def device_ms(self) -> float:
        """GPU time in ms from the step's first kernel to its sampled tokens (CUDA events; NaN on a CPU). Waits
        for the step if its tokens were not read (a step where no item samples)."""
        if self.start is None:
            return float("nan")
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


class TokenStaging:
    """Two pinned host buffers, used in turn: a step's tokens land in one while the other's are still being read."""

    def __init__(self, size: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers = [torch.empty(size, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self.turn = 0

    def timing_event(self):
        """A CUDA event recorded now on the current stream (None on a CPU)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stage(
        self,
        batch: ScheduledBatch,
        items: list,
        tokens: torch.Tensor | None,
        start,
        logprobs=None,
        prompt_logprobs=None,
    ) -> InFlightStep:
        """Start the copy of ``tokens`` [S] to the host without waiting for it. ``start``: a timing event recorded
        before the step's first kernel (``timing_event``). ``logprobs``/``prompt_logprobs`` stay on the device until
        the step lands."""
        end = self.timing_event()  # before the copy: once the tokens are on the host, ``end`` has passed
        if tokens is None:
            return InFlightStep(batch, items, None, None, None, start, end, prompt_logprobs=prompt_logprobs)
        host = self.buffers[self.turn][: tokens.shape[0]]
        self.turn ^= 1
        host.copy_(tokens, non_blocking=self.cuda)
        ready = None
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record()
        return InFlightStep(
            batch, items, tokens, host, ready, start, end, logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )


def pending_sources(ordered_items, previous: InFlightStep | None) -> tuple[list[int], list[int]]:
    """``(dst, src)``: flat input positions whose token is still on the device, and its row in ``previous``.

    ``ordered_items`` are the step's items in the order their tokens sit in the flat input. A sequence's
    pending token is its last one, so only an item that ends the sequence's tokens can hold it.
    """
    dst, src, at = [], [], 0
    for it in ordered_items:
        at += it.num_tokens
        seq = it.seq
        if seq.output_token_ids and seq.output_token_ids[-1] == PENDING_TOKEN and it.samples:
            row = None if previous is None else previous.row_of.get(seq.seq_id)
            if row is None:
                raise RuntimeError(f"sequence {seq.seq_id}'s last token is pending but no step in flight sampled it")
            dst.append(at - 1)
            src.append(row)
    return dst, src


def patch_pending(ids: torch.Tensor, ordered_items, previous: InFlightStep | None) -> None:
    """Write the pending tokens of ``ordered_items`` into the flat input ids ``ids`` on the device, from
    ``previous``'s sampled tokens: one small copy and a gather, no wait for the GPU."""
    dst, src = pending_sources(ordered_items, previous)
    if not dst:
        return
    index = torch.tensor([dst, src], dtype=torch.long).to(ids.device, non_blocking=True)
    ids.index_copy_(0, index[0], previous.device_tokens.index_select(0, index[1]))
