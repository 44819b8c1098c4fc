"""Sizing the KV pool: what is left of a memory fraction after weights, activations and graphs.

On a GPU the engine measures the activation peak of the largest step it will run (a dummy prefill
of ``max_num_batched_tokens`` tokens) instead of guessing it, and adds what a decode step holds
beyond that (the gathered K/V of the largest decode batch, the sampler's float32 copies of the
logits) plus a fixed reserve for CUDA graphs and cuBLAS workspaces. Whatever remains becomes KV
blocks, capped at what ``max_num_seqs`` sequences of ``max_model_len`` tokens could ever fill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.prefill import PrefillSegment
from servelab.kv.pool import KVPool

RESERVE_BYTES = 1 << 30  # graphs' private pool, cuBLAS/cuDNN workspaces, allocator fragmentation


@dataclass(frozen=True)
class MemoryPlan:
    total_bytes: int
    weights_bytes: int  # allocated after the model loaded (weights and buffers)
    activation_peak_bytes: int
    decode_extra_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int
    bytes_per_block: int
    num_blocks: int  # KV blocks the block manager hands out
    capped: bool  # True when max_num_seqs × max_model_len, not memory, set num_blocks

    def as_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def profile_activation_peak(model, config, max_model_len: int, max_num_seqs: int) -> int:
    """Peak bytes allocated during a dummy prefill of ``max_num_batched_tokens`` random tokens."""
    s = model.shape
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    tiny = KVPool(s.layers, 1, config.block_size, s.kv_heads, s.head_dim, dtype, dev)
    tokens = config.max_num_batched_tokens
    segs, q = [], 0
    while q < tokens:  # segments no longer than a request can be, each attending only to itself
        n = min(max_model_len, tokens - q)
        segs.append(PrefillSegment(q, n, 0, None))
        q += n
    meta = AttentionMetadata(slot_mapping=torch.zeros(tokens, dtype=torch.long, device=dev), prefills=segs)
    ids = torch.randint(0, s.vocab, (tokens,), device=dev)
    pos = torch.cat([torch.arange(sg.q_len, device=dev) for sg in segs])
    last = torch.arange(min(tokens, max_num_seqs), device=dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    model(ids, pos, meta, tiny, last)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(dev) - before
    del tiny
    torch.cuda.empty_cache()
    return int(peak)


def plan_kv_blocks(
    *,
    total: int,
    free: int,
    weights: int,
    activation_peak: int,
    decode_extra: int,
    fraction: float,
    bytes_per_block: int,
    max_blocks_per_seq: int,
    max_num_seqs: int,
    reserve: int = RESERVE_BYTES,
) -> MemoryPlan:
    """Pure arithmetic of the plan (bytes in, blocks out); ``plan_gpu_memory`` measures its inputs.

    The KV budget is ``fraction × total`` minus what is already allocated (weights) and what a step will
    need on top (activation peak, decode extras, reserve), and never more than is free right now (other
    processes may hold memory). Raises ``MemoryError`` when not even one full-length request fits.
    """
    overhead = activation_peak + decode_extra + reserve
    budget = min(int(fraction * total) - weights - overhead, free - overhead)
    by_memory = max(budget, 0) // bytes_per_block
    ceiling = max_num_seqs * max_blocks_per_seq
    n = min(by_memory, ceiling)
    if n < max_blocks_per_seq:
        raise MemoryError(
            f"the KV budget ({budget / 2**30:.2f} GiB) holds {by_memory} blocks; one request of full "
            f"length needs {max_blocks_per_seq}. Raise memory_fraction or lower "
            f"max_num_batched_tokens / max_num_seqs / max_model_len."
        )
    return MemoryPlan(
        total,
        weights,
        activation_peak,
        decode_extra,
        reserve,
        max(budget, 0),
        bytes_per_block,
        int(n),
        by_memory > ceiling,
    )


def plan_gpu_memory(model, config, max_model_len: int, backend: str) -> MemoryPlan:
    """Measure weights and the activation peak on the GPU, then ``plan_kv_blocks``."""
    s = model.shape
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    esize = torch.tensor([], dtype=dtype).element_size()
    weights = torch.cuda.memory_allocated(dev)
    peak = profile_activation_peak(model, config, max_model_len, config.max_num_seqs)
    free, total = torch.cuda.mem_get_info(dev)
    max_blocks = -(-max_model_len // config.block_size)
    # gathered K and V of the largest decode batch, and SDPA's contiguous copy of them
    gathered = 4 * config.max_num_seqs * max_blocks * config.block_size * s.kv_dim * esize if backend == "gather" else 0
    logits = config.max_num_seqs * s.vocab * (esize + 4 * 4)  # the graph's logits + softmax/sampling copies in fp32
    return plan_kv_blocks(
        total=total,
        free=free,
        weights=weights,
        activation_peak=peak,
        decode_extra=gathered + logits,
        fraction=config.memory_fraction,
        bytes_per_block=KVPool.block_bytes(s, config.block_size, dtype),
        max_blocks_per_seq=max_blocks,
        max_num_seqs=config.max_num_seqs,
    )
