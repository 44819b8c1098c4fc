"""Tensor parallelism on GPUs (issue 31): TP = 2 over NCCL, one GPU a rank, gives the unsplit engine's greedy tokens
in float32, eager and with the captured steps (whose graphs then hold the all-reduces). Marked ``gpu``, so
``make gpu-test`` runs it; on a machine of one GPU it skips, since a split needs two (the one-GPU sessions so far).
CPUs check the same over gloo in CI (``tests/test_tp_engine.py``)."""

import pytest
import torch

from servelab.engine import EngineConfig, SamplingParams
from servelab.engine.tp_engine import engine_from_spec

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 2, 7, 11, 3, 8], [4, 4, 6], list(range(1, 90))]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("spec", ["config:tiny-llama", "config:tiny-qwen2"])
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_tp2_over_nccl_gives_the_unsplit_engines_greedy_tokens(spec, captured):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"a split over two GPUs; this machine has {torch.cuda.device_count()}")
    cfg = EngineConfig(num_blocks=64, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
                       cuda_graphs=captured, step_graphs=captured)  # fmt: skip
    one = engine_from_spec(spec, dtype="float32", device="cuda", config=cfg)
    want = one.generate(PROMPTS, GREEDY)
    del one
    two = engine_from_spec(spec, dtype="float32", device="cuda", config=cfg, tensor_parallel_size=2, timeout_s=300)
    try:
        assert two.generate(PROMPTS, GREEDY) == want
        assert two.stats()["tensor_parallel_size"] == 2
    finally:
        two.close()
