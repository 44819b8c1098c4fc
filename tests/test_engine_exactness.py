"""Greedy outputs of the engine are token-identical to HF ``generate`` on the same weights (float32, CPU), at
weights whose continuations vary (``hf_reference`` says why the loader's init would not test much).

Covered for each tiny family: one prompt; a mixed batch of prompts of different lengths running
together; prompts split into chunks by a small token budget (chunked prefill over cached context);
a pool so small that sequences are preempted and recomputed.
"""

import pytest
import torch
from hf_reference import hf_greedy, varied, varies

from servelab.engine import Engine, EngineConfig, SamplingParams

FAMILIES = ["tiny-qwen2", "tiny-llama", "tiny-gpt2"]
STEPS = 10


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    hf = varied(request.param)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (6, 19, 33, 2)]
    refs = hf_greedy(hf, prompts, STEPS)
    assert varies(refs), refs
    return hf, prompts, refs


GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)


def test_single_prompt(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64))
    assert engine.generate([prompts[1]], GREEDY) == [refs[1]]


def test_mixed_batch_of_different_prompt_lengths(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=8, num_blocks=64))
    assert engine.generate(prompts, GREEDY) == refs
    assert engine.runner.eager_steps == STEPS  # all four prefills in one step, then decodes together


def test_prompts_split_into_chunks(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=7))
    assert engine.generate(prompts, GREEDY) == refs
    assert engine.steps > STEPS + 5  # 60 prompt tokens at 7 per step: the prompts really were chunked


def test_preemption_by_recompute_keeps_outputs_exact(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=16))
    assert engine.generate(prompts, GREEDY) == refs
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_used_blocks == 0


def test_reference_attention_backend_agrees(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, attention_backend="reference"))
    assert engine.generate(prompts[:2], GREEDY) == refs[:2]


def test_multi_step_decoding_gives_the_same_tokens(family):
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, decode_steps=4))
    mixed = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (STEPS, 3, 7, 1)]
    assert engine.generate(prompts, mixed) == [r[:n] for r, n in zip(refs, (STEPS, 3, 7, 1), strict=True)]
    assert engine.runner.decode_groups > 0


def test_whole_step_graph_path_is_exact_with_chunks_and_preemption(family):
    """Every step (prefill chunks, mixed, decodes) through the padded whole-step path with ragged attention,
    run uncaptured on the CPU: the same tokens as HF."""
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=16))
    engine.runner.enable_step_graphs([4, 8, 16], capture=False)
    assert engine.generate(prompts, GREEDY) == refs
    assert engine.scheduler.num_preemptions > 0
    assert engine.runner.step_graph_steps == engine.steps and engine.runner.eager_steps == 0
