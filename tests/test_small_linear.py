"""A decode step's linear layers with their elementwise work fused in (``kernels/small_linear.py``).

Under Triton's interpreter (a child process: the interpreter is chosen when a kernel is defined), each of
``linear``, ``norm_linear`` and ``silu_mul_linear`` equals the unfused PyTorch path (``F.linear``,
``layers.norm.rms_norm``, ``F.silu``) at shapes whose rows, outputs and inputs are not multiples of a block: to
float32 rounding in float32, and within bfloat16's precision in bfloat16 (the interpreter truncates where a GPU
rounds to nearest). The new residual stream ``h + delta`` is bitwise eager's in float32. Two layers of a Llama
block's linear work in the fused kernels give ``models.llama``'s block functions' residual stream and MLP output.
Split over the reduction (``split_k``), each agrees too and gives the same bits launch after launch. On a CUDA
device (skipped without one) the compiled kernel is checked the same way. Bad shapes are refused before any launch.
"""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

from servelab.errors import ParameterError

triton = pytest.importorskip("triton")
from servelab.kernels.small_linear import (  # noqa: E402
    MAX_ROWS,
    default_split,
    launch,
    linear,
    norm_linear,
    silu_mul_linear,
)

CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from servelab.kernels.small_linear import linear, norm_linear, silu_mul_linear
    from servelab.models.layers.norm import rms_norm
    from servelab.models.llama import attention_outputs, attention_qkv

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    # float32: sums of up to 1,000 products in another order than the reference's differ by about 1e-6
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        for m, n, k in ((1, 40, 72), (3, 17, 130), (8, 64, 33), (2, 300, 1000)):
            x, d, b = rnd(m, k, dtype=dtype), rnd(m, k, dtype=dtype), rnd(n, dtype=dtype)
            w = rnd(n, k, dtype=dtype) / k**0.5
            nw = 1 + rnd(k, dtype=dtype) / 10
            close = dict(rtol=tol, atol=tol)
            torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), **close)
            torch.testing.assert_close(linear(x, w), F.linear(x, w), **close)
            h, y = norm_linear(x, d, nw, 1e-6, w, b)
            if dtype == torch.float32:
                assert torch.equal(h, x + d), "the residual stream is eager's h + delta"
            torch.testing.assert_close(h, x + d, **close)
            torch.testing.assert_close(y, F.linear(rms_norm(x + d, nw, 1e-6), w, b), **close)
            h, y = norm_linear(x, None, nw, 1e-6, w)
            assert h is x
            torch.testing.assert_close(y, F.linear(rms_norm(x, nw, 1e-6), w), **close)
            gu = rnd(m, 2 * k, dtype=dtype)
            gate, up = gu.chunk(2, dim=-1)
            torch.testing.assert_close(silu_mul_linear(gu, w), F.linear(F.silu(gate) * up, w), **close)

    # split-K: each output tile's reduction over several programs, the last to finish adding the partials in split
    # order; 64 outputs a program make 64-input reduction steps, so these shapes take 2 to 16 steps
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        for m, n, k in ((3, 17, 130), (2, 300, 1000), (1, 40, 72)):
            x, d, b = rnd(m, k, dtype=dtype), rnd(m, k, dtype=dtype), rnd(n, dtype=dtype)
            w = rnd(n, k, dtype=dtype) / k**0.5
            nw = 1 + rnd(k, dtype=dtype) / 10
            gu = rnd(m, 2 * k, dtype=dtype)
            gate, up = gu.chunk(2, dim=-1)
            close = dict(rtol=tol, atol=tol)
            for split in (2, 3, 7):
                kw = dict(block_n=64, split_k=split)
                y = linear(x, w, b, **kw)
                torch.testing.assert_close(y, F.linear(x, w, b), **close)
                # the same bits again: the sum's order is fixed, and the counts the last launch left are back at 0
                assert torch.equal(linear(x, w, b, **kw), y), "split-K gives the same result every launch"
                h, y = norm_linear(x, d, nw, 1e-6, w, b, **kw)
                if dtype == torch.float32:
                    assert torch.equal(h, x + d), "every split writes its share of the residual stream"
                torch.testing.assert_close(y, F.linear(rms_norm(x + d, nw, 1e-6), w, b), **close)
                torch.testing.assert_close(silu_mul_linear(gu, w, **kw), F.linear(F.silu(gate) * up, w), **close)

    # two layers of a Llama block's linear work (attention's output held fixed), float32
    hidden, inter, q, kv, rows = 48, 80, 32, 8, 3
    f32 = dict(dtype=torch.float32)
    layers = [
        dict(nw1=1 + rnd(hidden, **f32) / 10, qkv_w=rnd(q + 2 * kv, hidden, **f32) / 7, qkv_b=rnd(q + 2 * kv, **f32),
             o_w=rnd(hidden, q, **f32) / 6, nw2=1 + rnd(hidden, **f32) / 10, gu_w=rnd(2 * inter, hidden, **f32) / 7,
             down_w=rnd(hidden, inter, **f32) / 9)
        for _ in range(2)
    ]
    h0, d0, attn = rnd(rows, hidden, **f32), rnd(rows, hidden, **f32), rnd(rows, q, **f32)
    h, delta, hf, df = h0, d0, h0, d0
    for w in layers:
        h, qkv = attention_qkv(h, delta, w["nw1"], 1e-6, w["qkv_w"], w["qkv_b"])
        h, delta = attention_outputs(h, attn, w["o_w"], w["nw2"], 1e-6, w["gu_w"], w["down_w"])
        hf, qkv_f = norm_linear(hf, df, w["nw1"], 1e-6, w["qkv_w"], w["qkv_b"])
        hf, gate_up = norm_linear(hf, linear(attn, w["o_w"]), w["nw2"], 1e-6, w["gu_w"])
        df = silu_mul_linear(gate_up, w["down_w"])
        torch.testing.assert_close(qkv_f, qkv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf, h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(df, delta, rtol=1e-5, atol=1e-5)
    print("ok")
    """
)


def test_fused_linear_layers_equal_the_unfused_path_under_the_interpreter():
    run_interpreted(CHECK)


@pytest.mark.gpu
def test_fused_linear_layers_equal_the_unfused_path_on_the_gpu():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: linear(torch.zeros(MAX_ROWS + 1, 8), torch.zeros(4, 8)), "1 to 8 rows"),
        (lambda: linear(torch.zeros(2, 8), torch.zeros(4, 6)), "does not take 8 inputs"),
        (lambda: linear(torch.zeros(2, 8), torch.zeros(4, 8, dtype=torch.float64)), "input is torch.float32"),
        (lambda: linear(torch.zeros(8), torch.zeros(4, 8)), "must be 2-D"),
        (lambda: linear(torch.zeros(8, 2).t(), torch.zeros(4, 8)), "contiguous"),
        (lambda: norm_linear(torch.zeros(2, 8), torch.zeros(3, 8), torch.ones(8), 1e-6, torch.zeros(4, 8)), "delta"),
        (lambda: norm_linear(torch.zeros(2, 8), None, torch.ones(6), 1e-6, torch.zeros(4, 8)), "norm weight"),
        (lambda: silu_mul_linear(torch.zeros(2, 9), torch.zeros(4, 4)), "2·I"),
        (lambda: silu_mul_linear(torch.zeros(2, 8), torch.zeros(4, 8)), "does not take 4 inputs"),
        (lambda: linear(torch.zeros(2, 8), torch.zeros(4, 8), split_k=0), "split_k must be a positive integer"),
        (lambda: linear(torch.zeros(2, 8), torch.zeros(4, 8), pdl=1), "pdl must be True or False"),
        (lambda: linear(torch.zeros(2, 8), torch.zeros(4, 8), pdl=True), "compute capability 9.0"),
    ],
)
def test_bad_shapes_are_refused_before_any_launch(call, message):
    with pytest.raises(ParameterError, match=message):
        call()


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("n, k", [(896, 896), (1152, 896), (9728, 896), (896, 4864), (151936, 896), (14336, 4096)])
def test_a_launch_fills_the_gpu_and_keeps_its_product_tile_small(rows, n, k):
    block_m, block_n, block_k = launch(rows, n, k)
    assert block_m >= rows and block_m & (block_m - 1) == 0
    assert block_n * block_k <= 4096  # the weight tile a program holds at once, whatever the rows
    assert triton.cdiv(n, block_n) >= 100  # programs: most of an H100's or H200's 132 SMs


def test_the_reduction_splits_by_default_only_where_output_tiles_are_few(monkeypatch):
    """One split per reduction step where the output tiles are under two per SM (Qwen2-0.5B's down: 224 tiles of
    4 outputs, 5 steps of 1,024 inputs, on 132 SMs), none where they fill the GPU or on a CPU."""
    import servelab.kernels.small_linear as small_linear

    assert default_split(224, 5, "cpu") == 1
    monkeypatch.setattr(small_linear, "sm_count", lambda device: 132)
    _, bn, bk = launch(1, 896, 4864)
    assert default_split(triton.cdiv(896, bn), triton.cdiv(4864, bk), "cuda") == 5  # 0.5B down
    _, bn, bk = launch(1, 4096, 14336)
    assert default_split(triton.cdiv(4096, bn), triton.cdiv(14336, bk), "cuda") == 1  # 8B down: 1,024 tiles
    assert default_split(224, 1, "cuda") == 1  # one step: nothing to split


PDL_CHECK = textwrap.dedent(
    """
    import torch
    from servelab.kernels import pdl
    from servelab.kernels.small_linear import linear, norm_linear, silu_mul_linear

    assert pdl.supported("cuda"), torch.cuda.get_device_name()
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.bfloat16) * 0.1
    layers = [dict(nw=1 + r(896), qkv=r(1152, 896), b=r(1152), o=r(896, 896), gu=r(9728, 896), down=r(896, 4864))
              for _ in range(3)]
    h0, d0, attn = r(1, 896), r(1, 896), r(1, 896)

    def chain(pdl):
        h, d = h0, d0
        for w in layers:
            h, qkv = norm_linear(h, d, w["nw"], 1e-6, w["qkv"], w["b"], pdl=pdl)
            h, gate_up = norm_linear(h, linear(attn, w["o"], pdl=pdl), w["nw"], 1e-6, w["gu"], pdl=pdl)
            d = silu_mul_linear(gate_up, w["down"], pdl=pdl)
        return h, d, qkv

    want = chain(False)
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(True)
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            assert torch.equal(a, b), (a - b).abs().max()
    print("ok")
    """
)


@pytest.mark.gpu
def test_launches_with_pdl_give_the_same_bits_inside_a_cuda_graph():
    """Programmatic dependent launch lets each launch read its first weight tile while the one before drains, and
    wait for it before reading anything it wrote: three layers' chain, captured and replayed, equals the chain
    launched without it, bit for bit (a race on an input would show as a difference, though not in every run)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PDL_CHECK], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
