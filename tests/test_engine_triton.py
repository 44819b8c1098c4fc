"""The Triton paged-decode kernel, run by Triton's interpreter on the CPU (where Triton is installed): one pass
and split-KV, head sizes 16 to 96 (80 and 96 padded to 128 inside the kernel).

The interpreter is chosen when the kernel is defined, so the checks run in a child process with
``TRITON_INTERPRET=1``. CI images without Triton skip this; the GPU bench runs the compiled kernel and
checks the engine against HF there (``exactness.csv``).
"""

import textwrap

import pytest
from interpreted import run_interpreted

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from servelab.kernels.decode import DECODE_BACKENDS, gather_decode
    triton_decode = DECODE_BACKENDS["triton"]
    g = torch.Generator().manual_seed(0)
    shapes = [(14, 2, 64, 16), (4, 4, 16, 4), (6, 2, 32, 16), (4, 1, 16, 8), (4, 2, 80, 8), (6, 2, 96, 16)]
    for heads, kv_heads, head_dim, block_size in shapes:
        kp = torch.randn(40, block_size, kv_heads, head_dim, generator=g)
        vp = torch.randn(40, block_size, kv_heads, head_dim, generator=g)
        lens = torch.tensor([1, 5, 70, 130])
        width = max(-(-n // block_size) for n in lens.tolist())
        tables = torch.stack([torch.randperm(40, generator=g)[:width] for _ in lens])
        q = torch.randn(4, heads, head_dim, generator=g)
        ref = gather_decode(q, kp, vp, tables, lens, head_dim ** -0.5)
        torch.testing.assert_close(triton_decode(q, kp, vp, tables, lens, head_dim ** -0.5), ref, rtol=1e-5, atol=1e-5)
        # split-KV: 16-key chunks, so 70 and 130 keys split unevenly and the fifth split of a short context is empty
        for splits in (2, 5):
            got = triton_decode(q, kp, vp, tables, lens, head_dim ** -0.5, splits=splits, min_split_keys=16)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)

    from servelab.kernels.triton_decode import tune_triton_decode
    assert tune_triton_decode(14, 2, 64, 16, torch.float32, "cpu").startswith("not tuned")  # GPUs only

    from servelab.engine import Engine, EngineConfig, SamplingParams
    from servelab.models import load_model
    hf = load_model("config:tiny-llama").model
    prompts = [[5, 6, 7], list(range(10, 40))]
    cfg = dict(block_size=4, num_blocks=64)
    gather = Engine.from_hf(hf, EngineConfig(**cfg, attention_backend="gather"))
    ref = gather.generate(prompts, SamplingParams(max_tokens=5))
    eng = Engine.from_hf(hf, EngineConfig(**cfg, attention_backend="triton"))
    assert eng.backend == "triton"
    assert eng.generate(prompts, SamplingParams(max_tokens=5)) == ref
    print("ok")
""")


def test_triton_decode_matches_gather_decode_and_drives_the_engine():
    run_interpreted(CHECK)
