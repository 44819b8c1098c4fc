"""Tensor parallelism (issue 31, item 1): TP = 2 against TP = 1, token for token, in float32, with two CPU
processes over gloo; and the split itself, checked in one process where no collective is needed."""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams, tp_engine
from servelab.engine import tensor_parallel as tp
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.models.native import native_from_hf

PROMPTS = [[5, 9, 2, 7, 11, 3, 8], [4, 4, 6], list(range(1, 40))]


def _full(spec: str):
    lm = load_model(spec, dtype="float32", device="cpu", seed=0, load_tokenizer=False)
    return native_from_hf(lm.model, max_positions=512)


@pytest.mark.parametrize("spec", ["config:tiny-llama", "config:tiny-qwen2"])  # 1 KV head (replicated); 2, with bias
def test_the_shards_hold_every_weight_once(spec):
    full = _full(spec)
    s = full.shape
    shards = [tp.shard_model(full, r, 2) for r in range(2)]
    for i, whole in enumerate(full.layers):
        parts = [m.layers[i] for m in shards]
        # the output projections' columns and the MLP's rows, put back together, are the whole model's
        assert torch.equal(torch.cat([p.o_proj.weight for p in parts], dim=1), whole.o_proj.weight)
        assert torch.equal(torch.cat([p.down.weight for p in parts], dim=1), whole.down.weight)
        q = torch.cat([p.qkv.weight[: s.q_dim // 2] for p in parts])
        assert torch.equal(q, whole.qkv.weight[: s.q_dim])
    assert shards[0].shape.heads == s.heads // 2 and shards[0].shape.head_dim == s.head_dim
    assert shards[0].shape.kv_heads == max(1, s.kv_heads // 2)
    assert all(torch.equal(m.embed.weight, full.embed.weight) for m in shards)


def test_a_split_that_does_not_divide_is_refused():
    full = _full("config:tiny-llama")  # 4 heads
    with pytest.raises(ParameterError, match="must divide the attention heads"):
        tp.shard_model(full, 0, 3)
    with pytest.raises(ParameterError, match="outside a tensor parallel group"):
        tp.shard_model(full, 2, 2)


@pytest.mark.parametrize("spec", ["config:tiny-llama", "config:tiny-qwen2"])
def test_tp2_on_two_cpu_processes_gives_tp1s_greedy_tokens(spec):
    one = Engine(_full(spec), EngineConfig(num_blocks=64, cuda_graphs=False))
    want = one.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    got = tp_engine.generate(spec, PROMPTS, world=2, max_tokens=12, timeout_s=300)
    assert got == want
