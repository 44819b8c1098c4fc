"""From a scheduled batch to the tensors one forward needs: flat token ids, positions and attention metadata.

Decode items (one token each) come first in the flat batch, then prefill chunks, as the attention
layer expects. ``order`` maps flat positions back to the scheduler's items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from servelab.engine.block_tables import DeviceBlockTables
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence
from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.context_prefill import build_context_batch
from servelab.kernels.prefill import PrefillSegment


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # LongTensor [T]
    positions: torch.Tensor  # LongTensor [T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # LongTensor [S]: flat index of each sampling item's last token
    sampling_items: list[ScheduledSequence]  # the S items that sample, in logits order
    ordered_items: list[ScheduledSequence]  # every item, in the order of its tokens in input_ids
    # with ``prompt_logprobs``: logits rows past the S sampling ones, per (sequence, first prompt token, count),
    # and the prompt token each row scores
    prompt_spans: list = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)


def _to_device(values: list[int], device, dtype=torch.long) -> torch.Tensor:
    """A host list on ``device`` without waiting for the GPU (a blocking copy would end the overlap of steps)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def build_step_inputs(
    batch: ScheduledBatch, tables: DeviceBlockTables, device, *, varlen: bool = False, prompt_logprobs: bool = False
) -> StepInputs:
    """``varlen``: run the context-free prefill segments as one varlen attention call (when there are two or more).
    ``prompt_logprobs``: also ask for the logits of the prompt positions of sequences that need prompt logprobs
    (rows after the sampling ones; ``Sequence.prompt_logprobs_asked`` moves past them)."""
    decodes = [it for it in batch.items if it.is_decode]
    fresh = [it for it in batch.items if not it.is_decode and it.start == 0]
    prefills = fresh + [it for it in batch.items if not it.is_decode and it.start > 0]
    ordered = decodes + prefills
    ids, pos, slots = [], [], []
    for it in ordered:
        ids += it.seq.token_ids(it.start, it.start + it.num_tokens)
        pos += range(it.start, it.start + it.num_tokens)
        slots += it.slots
    meta = AttentionMetadata(slot_mapping=_to_device(slots, device), num_decode_tokens=len(decodes))
    bm = tables.bm
    if decodes:
        positions = [it.start for it in decodes]
        rows = tables.rows_for([it.seq.seq_id for it in decodes], positions, [it.slots[0] for it in decodes])
        meta.decode_context_lens = _to_device([p + 1 for p in positions], device)
        meta.decode_block_tables = tables.gather(rows, max(positions) // bm.block_size + 1)
    q = len(decodes)
    context = []
    for it in prefills:
        # segments with cached context run batched (meta.context), so none needs its own block table
        meta.prefills.append(PrefillSegment(q, it.num_tokens, it.start, None))
        if it.start > 0:
            context.append((q, it.num_tokens, it.start, bm.slot_mapping(it.seq.seq_id, 0, it.start + it.num_tokens)))
        q += it.num_tokens
    if context:
        meta.context = build_context_batch(context, device)
    if varlen and len(fresh) >= 2:
        lens = [it.num_tokens for it in fresh]
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        meta.varlen_segments = len(fresh)
        meta.varlen_cu_seqlens = _to_device(offsets, device, torch.int32)
        meta.varlen_max_len = max(lens)
    sampling, last = [], []
    q = 0
    for it in ordered:
        q += it.num_tokens
        if it.samples:
            sampling.append(it)
            last.append(q - 1)
    spans, targets = prompt_rows(ordered, last) if prompt_logprobs else ([], [])
    ids_t, pos_t, last_t = _to_device(ids, device), _to_device(pos, device), _to_device(last, device)
    return StepInputs(ids_t, pos_t, meta, last_t, sampling, ordered, spans, targets)


def prompt_rows(ordered: list[ScheduledSequence], indices: list[int]) -> tuple[list, list[int]]:
    """Append to ``indices`` the flat positions whose logits give prompt logprobs; (spans, target tokens).

    Position p's logits score prompt token p + 1, so a prompt of P tokens needs positions 0 … P - 2 (the last
    position's logits sample the first output token instead)."""
    spans, targets, q = [], [], 0
    for it in ordered:
        seq = it.seq
        if seq.needs_prompt_logprobs:
            first = max(it.start, seq.prompt_logprobs_asked)
            end = min(it.start + it.num_tokens, len(seq.prompt_token_ids) - 1)
            if end > first:
                indices += range(q + first - it.start, q + end - it.start)
                targets += seq.prompt_token_ids[first + 1 : end + 1]
                spans.append((seq, first + 1, end - first))
                seq.prompt_logprobs_asked = end
        q += it.num_tokens
    return spans, targets
