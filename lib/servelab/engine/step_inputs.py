"""From a scheduled batch to the tensors one forward needs: flat token ids, positions and attention metadata.

Decode items (one token each) come first in the flat batch, then prefill chunks, as the attention
layer expects. ``order`` maps flat positions back to the scheduler's items.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _to_device(values: list[int], device, dtype=torch.long) -> torch.Tensor:
    """A host list on ``device`` without waiting for the GPU (a blocking copy would end the overlap of steps)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def build_step_inputs(batch: ScheduledBatch, tables: DeviceBlockTables, device, *, varlen: bool = False) -> StepInputs:
    """``varlen``: run the context-free prefill segments as one varlen attention call (when there are two or more)."""
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
    return StepInputs(
        _to_device(ids, device), _to_device(pos, device), meta, _to_device(last, device), sampling, ordered
    )
