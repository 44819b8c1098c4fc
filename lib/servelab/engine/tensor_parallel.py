"""Tensor parallelism for the engine's Llama/Qwen2 model: one process per device, each holding 1/N of every
block's attention heads and of its MLP's columns (Megatron-LM's split), with one all-reduce after the attention's
output projection and one after the MLP's down projection.

Each rank runs a whole engine over its shard: its scheduler, its KV pool (its own heads only), its sampler; the
driver of ``tp_engine`` gives every rank the same requests, in the same order. Since the all-reduced hidden states,
and so the logits, are the same on every rank, every scheduler and every sampler makes the same choice in lockstep,
and no tokens need to travel between ranks. Embedding, norms and the LM head are replicated. Where a model has
fewer KV heads than ranks (GQA), each rank keeps the one KV head its query heads read.

- ``shard_config``: the config of one rank's shard (heads, KV heads and MLP width divided; head_dim kept);
- ``TPLlamaModel``: ``LlamaModel`` whose block output function all-reduces, whatever ``compile_blocks`` and the
  fused RoPE write do to the block functions;
- ``shard_model``: a rank's ``TPLlamaModel`` holding its slices of a full model's weights;

The engine that runs these shards, one process each, is ``tp_engine``'s.

Checked on CPUs only (``tests/test_tensor_parallel.py``, ``tests/test_tp_engine.py``: TP = 2 gives TP = 1's greedy
tokens, float32, gloo); no machine of several GPUs has been lent, so the NCCL path, and an all-reduce inside
captured CUDA graphs, has never run.
"""

from __future__ import annotations

import copy
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F

from servelab.errors import ParameterError
from servelab.models.layers.compiled import compiled
from servelab.models.layers.norm import rms_norm
from servelab.models.llama import LlamaModel, final_norm

# the machine's rule: no NVLink multicast in any process (NCCL's NVLS, symmetric memory, NVSHMEM)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def attention_outputs_tp(h, attn, o_w, norm_w, eps: float, gate_up_w, down_w):
    """``llama.attention_outputs`` over a shard: each rank's o_proj and down give partial sums, all-reduced."""
    o = F.linear(attn, o_w)
    dist.all_reduce(o)
    h = h + o
    gate, up = F.linear(rms_norm(h, norm_w, eps), gate_up_w).chunk(2, dim=-1)
    down = F.linear(F.silu(gate) * up, down_w)
    dist.all_reduce(down)
    return h, down


class TPLlamaModel(LlamaModel):
    """One rank's shard; its config is ``shard_config``'s. The all-reduce stays outside ``torch.compile``."""

    sharded = True  # models.small_batch's fused blocks make no all-reduce: they stay off

    def __init__(self, config, **kw):
        super().__init__(config, **kw)
        self.block_fns = (self._pre_fn(), attention_outputs_tp)

    @staticmethod
    def smallest_over_ranks(n: int) -> int:
        """The smallest ``n`` of any rank (the engine's KV pool: each rank sizes it from its own free memory, and a
        rank that could hold more would schedule otherwise)."""
        t = torch.tensor([n], dtype=torch.long, device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def set_fused_rope_kv_write(self, on: bool) -> None:
        super().set_fused_rope_kv_write(on)
        self.block_fns = (self.block_fns[0], attention_outputs_tp)

    def compile_blocks(self, **compile_kw) -> None:
        self.block_fns = (compiled(self._pre_fn(), **compile_kw), attention_outputs_tp)
        self.final_norm = compiled(final_norm, **compile_kw)


def _split(config, world: int) -> tuple[int, int, int, int]:
    """``(heads, kv_heads, intermediate, head_dim)`` per rank, or a ParameterError saying why the model won't split."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if world < 1 or heads % world or config.intermediate_size % world:
        raise ParameterError(
            f"tensor parallel size {world} must divide the attention heads ({heads}) and the MLP width "
            f"({config.intermediate_size})"
        )
    if kv % world and world % kv:
        raise ParameterError(f"tensor parallel size {world} and the KV heads ({kv}) must divide one another")
    return heads // world, max(1, kv // world), config.intermediate_size // world, head_dim


def shard_config(config, world: int):
    """A copy of ``config`` for one rank's shard: heads, KV heads and MLP width divided; head_dim kept explicit."""
    heads, kv, inter, head_dim = _split(config, world)
    cfg = copy.deepcopy(config)
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size = heads, kv, inter
    cfg.head_dim = head_dim  # else it would be derived again from the hidden size over the fewer heads
    return cfg


@torch.no_grad()
def shard_model(full: LlamaModel, rank: int, world: int) -> TPLlamaModel:
    """Rank ``rank``'s shard of ``full`` (same dtype and device): its query heads, the KV heads they read, its
    MLP columns; embedding, norms and LM head copied whole."""
    if not 0 <= rank < world:
        raise ParameterError(f"rank {rank} outside a tensor parallel group of {world}")
    s = full.shape
    heads, kv, inter, hd = _split(full.config, world)
    q0 = rank * heads * hd
    group = s.heads // s.kv_heads  # query heads per KV head
    kv_head = rank * heads // group  # the first KV head this rank's query heads read
    if (rank * heads + heads - 1) // group >= kv_head + kv:
        raise ParameterError(f"rank {rank}'s query heads read more KV heads than it holds")
    k0, i0 = kv_head * hd, rank * inter
    p = next(full.parameters())
    with torch.device(p.device):
        model = TPLlamaModel(shard_config(full.config, world), max_positions=full.max_positions)
    model.to(p.dtype)
    model.embed.weight.copy_(full.embed.weight)
    model.norm.weight.copy_(full.norm.weight)
    if not model.shape.tied_embeddings:
        model.lm_head.weight.copy_(full.lm_head.weight)
    model.rotary.cos, model.rotary.sin = full.rotary.cos, full.rotary.sin
    for mine, whole in zip(model.layers, full.layers, strict=True):
        mine.input_norm.weight.copy_(whole.input_norm.weight)
        mine.post_norm.weight.copy_(whole.post_norm.weight)
        q, k, v = whole.qkv.weight.split([s.q_dim, s.kv_dim, s.kv_dim])
        mine.qkv.weight.copy_(torch.cat([q[q0 : q0 + heads * hd], k[k0 : k0 + kv * hd], v[k0 : k0 + kv * hd]]))
        if whole.qkv.bias is not None:
            qb, kb, vb = whole.qkv.bias.split([s.q_dim, s.kv_dim, s.kv_dim])
            mine.qkv.bias.copy_(torch.cat([qb[q0 : q0 + heads * hd], kb[k0 : k0 + kv * hd], vb[k0 : k0 + kv * hd]]))
        mine.o_proj.weight.copy_(whole.o_proj.weight[:, q0 : q0 + heads * hd])
        gate, up = whole.gate_up.weight.chunk(2)
        mine.gate_up.weight.copy_(torch.cat([gate[i0 : i0 + inter], up[i0 : i0 + inter]]))
        mine.down.weight.copy_(whole.down.weight[:, i0 : i0 + inter])
    return model.eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
