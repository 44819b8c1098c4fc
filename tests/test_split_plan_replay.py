"""The GPU's long-context split test (test_gpu_engine.py) on a CPU: the engine's scheduler runs its prompts, and
the tile planner (kernels/ragged.py) plans each step the whole-step graphs would run, as step_graphs.py does. Its
prompts must give a split chunk and a split decode there, or the GPU test fails by its design, as it did at
earlier lengths on the H200 and an H100. The replay has no CUDA graph and no Triton: what it checks is the plan."""

from __future__ import annotations

import pytest
import torch
from test_gpu_engine import SPLIT_CONFIG, SPLIT_PROMPTS, STEPS

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.kernels.ragged import plan_splits, plan_tiles, ragged_long_tile_tokens, ragged_tile_tokens, split_budget
from servelab.models import load_model

SMS = 132  # the H200's and the H100's multiprocessors: the split budget's GPU


@pytest.fixture(scope="module")
def model():
    return load_model("config:tiny-llama", dtype="float32", device="cpu").model


def planned_columns(model, lengths) -> list[list[tuple]]:
    """Each whole-step graph step's split columns (a decode-only step replays the decode graphs: not planned)."""
    c = model.config
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(3, c.vocab_size, (n,), generator=g).tolist() for n in lengths]
    engine = Engine.from_hf(model, EngineConfig(**SPLIT_CONFIG))
    steps, schedule = [], engine.scheduler.schedule

    def record():
        batch = schedule()
        steps.append([(it.start, it.num_tokens) for it in batch.items])
        return batch

    engine.scheduler.schedule = record
    engine.generate(prompts, SamplingParams(max_tokens=STEPS, ignore_eos=True))
    head_dim = c.hidden_size // c.num_attention_heads
    tile, long_tile = (
        ragged_tile_tokens(c.num_attention_heads, c.num_key_value_heads),
        ragged_long_tile_tokens(head_dim),
    )
    budget = split_budget(c.num_key_value_heads, engine.max_model_len, SMS)
    out = []
    for step in steps:
        if all(n == 1 for _, n in step):
            continue
        runs, flat = [], 0
        for row, (start, n) in enumerate(step):
            runs.append((row, flat, n, start))
            flat += n
        packed, _ = plan_tiles(runs, tile, long_tile)
        out.append(plan_splits(packed, budget, c.num_key_value_heads, SMS)[1])
    return out


def kinds(columns: list[list[tuple]]) -> tuple[bool, bool]:
    cols = [col for step in columns for col in step]
    return any(col[2] > 1 for col in cols), any(col[2] == 1 for col in cols)  # (a chunk split, a decode split)


def test_the_gpu_tests_prompts_split_a_chunk_and_a_decode(model):
    assert kinds(planned_columns(model, SPLIT_PROMPTS)) == (True, True)


@pytest.mark.parametrize(
    "lengths, expected",
    [
        ((1500, 6, 19, 33, 45), (False, True)),  # every chunk 476-512 tokens: long tiles, which never split
        ((1100, 6, 19, 33, 45), (True, False)),  # the long prompt decodes in decode-only steps alone
    ],
)
def test_the_earlier_lengths_fail_as_the_gpus_did(model, lengths, expected):
    assert kinds(planned_columns(model, lengths)) == expected
