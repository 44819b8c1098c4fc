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
- ``generate``: a split engine's greedy tokens (``EngineConfig.tensor_parallel_size``); with ``repeats``,
  ``timed``'s TTFT and decode time per token at batch 1 instead (the Beyond-one-GPU page's TP table, once a machine
  of several GPUs runs it: ``python -m servelab.engine.tensor_parallel``).

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

    def __init__(self, config, *, world: int = 1, **kw):
        super().__init__(config, **kw)
        self.tp_world = world  # the engine checks it against EngineConfig.tensor_parallel_size
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
        model = TPLlamaModel(shard_config(full.config, world), world=world, max_positions=full.max_positions)
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


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def timed(engine, prompts: list[list[int]], max_tokens: int, repeats: int) -> list[dict]:
    """Per prompt, alone (batch 1): the median wall time of its first token (prefill and one step) and of each
    later token, over ``repeats`` runs after one warm-up; every rank runs it in lockstep, so the collectives are
    inside the times. Wall clock around whole generations, synchronized: the all-reduces block the host anyway."""
    import statistics
    import time

    from servelab.engine import SamplingParams

    def run(prompt, n: int) -> float:
        _sync(engine)
        t0 = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        _sync(engine)
        return time.perf_counter() - t0

    rows = []
    for i, prompt in enumerate(prompts):
        run(prompt, max_tokens)  # first use: kernels, graphs, allocator
        first = statistics.median(run(prompt, 1) for _ in range(repeats))
        whole = statistics.median(run(prompt, max_tokens) for _ in range(repeats))
        per_token = (whole - first) * 1e3 / max(1, max_tokens - 1)
        rows.append(dict(prompt=i, prompt_tokens=len(prompt), new_tokens=max_tokens, ttft_ms=first * 1e3,
                         decode_ms_per_token=per_token, repeats=repeats))  # fmt: skip
    return rows


def generate(
    spec: str,
    prompts: list[list[int]],
    *,
    world: int,
    max_tokens: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    max_positions: int = 512,
    engine: dict | None = None,
    timeout_s: float = 600.0,
    repeats: int = 0,
):
    """Greedy tokens of ``prompts`` from ``spec`` split over ``world`` processes (``EngineConfig.
    tensor_parallel_size``: CPUs over gloo; ``device="cuda"``, one GPU each over NCCL). With ``repeats`` > 0, instead
    of the tokens, ``timed``'s rows: each prompt's time to first token and decode time per token at batch 1."""
    from servelab.engine import Engine, EngineConfig, SamplingParams

    settings = engine or {"num_blocks": 64, "cuda_graphs": device == "cuda"}
    cfg = EngineConfig(**settings, max_model_len=max_positions, tensor_parallel_size=world)
    kw = {"timeout_s": timeout_s} if world > 1 else {}
    e = Engine.from_spec(spec, dtype=dtype, device=device, config=cfg, seed=seed, **kw)
    try:
        if repeats:
            return timed(e, prompts, max_tokens, repeats)
        return e.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    finally:
        if hasattr(e, "close"):
            e.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m servelab.engine.tensor_parallel --spec config:llama-3-8b --sizes 1 2 4 --out tp.csv``: TTFT and
    decode ms per token at batch 1 per TP size, one CSV row per (size, prompt)."""
    import argparse

    import pandas as pd

    ap = argparse.ArgumentParser(prog="python -m servelab.engine.tensor_parallel", description=main.__doc__)
    ap.add_argument("--spec", default="config:llama-3-8b")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    prompts = [[(7 * i + 3) % 1000 + 10 for i in range(n)] for n in a.prompt_tokens]
    positions = max(a.prompt_tokens) + a.new_tokens + 16
    engine = {"num_blocks": positions // 16 + 8, "cuda_graphs": a.device == "cuda"}  # one sequence at a time
    frames = []
    for world in a.sizes:
        rows = generate(a.spec, prompts, world=world, max_tokens=a.new_tokens, dtype=a.dtype, device=a.device,
                        max_positions=positions, engine=engine, repeats=a.repeats)  # fmt: skip
        frames.append(pd.DataFrame(rows).assign(spec=a.spec, tp=world, device=a.device, dtype=a.dtype))
    pd.concat(frames, ignore_index=True).to_csv(a.out, index=False)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
