"""Head sizes that are not a power of two (80: Phi-2's; 96) run through every attention path, token-exact.

The engine's greedy tokens equal HF ``generate``'s in float32 on tiny configs with head_dim 80 and 96: on the
PyTorch paths (gather, reference, the padded whole-step path) in this process, and on the Triton kernels
(paged decode with split-KV forced on, ragged) under Triton's interpreter in a child process, since the
interpreter is chosen when a kernel is defined.
"""

import textwrap

import pytest
import torch
from hf_reference import hf_greedy, varied, varies
from interpreted import run_interpreted

from servelab.engine import Engine, EngineConfig, SamplingParams

CONFIGS = ["tiny-llama-hd80", "tiny-qwen2-hd96"]
STEPS = 8
GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)
PROMPT_LENS = (5, 40, 17)


def hf_case(name):
    hf = varied(name)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
    refs = hf_greedy(hf, prompts, STEPS)
    assert varies(refs), refs
    return hf, prompts, refs


@pytest.fixture(scope="module", params=CONFIGS)
def case(request):
    return hf_case(request.param)


def test_the_configs_have_the_head_sizes_they_are_named_for(case):
    from servelab.models import ModelShape

    hf, _, _ = case
    assert ModelShape.from_config(hf.config).head_dim in (80, 96)


@pytest.mark.parametrize("backend", ["gather", "reference"])
def test_eager_paths_give_hf_greedy_tokens(case, backend):
    hf, prompts, refs = case
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, attention_backend=backend))
    assert engine.generate(prompts, GREEDY) == refs


def test_whole_step_path_gives_hf_greedy_tokens_with_chunks(case):
    hf, prompts, refs = case
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16))
    engine.runner.enable_step_graphs([4, 8, 16], capture=False)
    assert engine.generate(prompts, GREEDY) == refs
    assert engine.runner.step_graph_steps == engine.steps and engine.runner.eager_steps == 0


INTERPRETED_CHECK = textwrap.dedent("""
    import torch
    import servelab.kernels.split_kv as split_kv
    import servelab.kernels.triton_decode as triton_decode
    import tests.test_engine_head_sizes as t
    from servelab.engine import Engine, EngineConfig

    # split contexts of 32 keys and more, so these short prompts go through split-KV and its merge
    split_kv.MIN_SPLIT_KEYS = triton_decode.MIN_SPLIT_KEYS = 16
    calls = []
    real = split_kv.decode_splits
    triton_decode.decode_splits = lambda *a: calls.append(real(*a)) or calls[-1]
    for name in t.CONFIGS:
        hf, prompts, refs = t.hf_case(name)
        engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, attention_backend="triton"))
        assert engine.generate(prompts, t.GREEDY) == refs, name
        chunked = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16)
        engine = Engine.from_hf(hf, chunked)
        engine.runner.enable_step_graphs([4, 8, 16], capture=False)
        assert engine.generate(prompts, t.GREEDY) == refs, name
    assert max(calls) > 1, calls  # decode steps really were split
    print("ok")
""")


def test_triton_kernels_give_hf_greedy_tokens_under_the_interpreter():
    run_interpreted(INTERPRETED_CHECK)
