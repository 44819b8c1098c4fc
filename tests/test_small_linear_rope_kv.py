"""``kernels.small_linear.norm_linear_rope_kv``: a layer's qkv projection with RoPE and the KV-pool write in its
epilogue equals ``models.llama.attention_qkv`` followed by ``kernels.rope_kv_write`` (the path it replaces).

Under Triton's interpreter (a child process), at head sizes whose half is not a power of two, with and without
q/k/v biases, grouped-query heads, one to three rows, and the reduction split over programs: the rotated q and
the pools agree to float32 rounding in float32 (the new residual stream bitwise) and within bfloat16's precision in
bfloat16, and no slot but the rows' own is written. On a CUDA device (skipped without one) the compiled kernel is
checked the same way. Shapes the pool or RoPE cannot take are refused before any launch.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
from interpreted import run_interpreted

from servelab.errors import ParameterError

pytest.importorskip("triton")
from servelab.kernels.small_linear import RopeKV, norm_linear_rope_kv  # noqa: E402

CHECK = textwrap.dedent(
    """
    import torch
    from servelab.kernels.rope_kv_write import rope_kv_write
    from servelab.kernels.small_linear import RopeKV, norm_linear_rope_kv
    from servelab.models.llama import attention_qkv

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    # (rows, heads, kv heads, head_dim, hidden, q/k/v bias, launch): head_dim 6 has 3 pairs a head, so a program's
    # two pairs straddle heads; 14 query heads over 2 kv heads at head_dim 64 is Qwen2-0.5B's grouping
    cases = [
        (1, 4, 2, 8, 40, True, {}),
        (3, 2, 1, 6, 130, False, {}),
        (2, 4, 2, 8, 300, True, dict(block_n=4, split_k=3)),
        (1, 14, 2, 64, 96, True, {}),
    ]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        for m, heads, kv_heads, d, hidden, bias, kw in cases:
            n = (heads + 2 * kv_heads) * d
            h, delta = rnd(m, hidden, dtype=dtype), rnd(m, hidden, dtype=dtype)
            w, b = rnd(n, hidden, dtype=dtype) / hidden**0.5, rnd(n, dtype=dtype) if bias else None
            nw = 1 + rnd(hidden, dtype=dtype) / 10
            angle = (torch.arange(m) * 7 + 3)[:, None].float() / 10000 ** (torch.arange(0, d, 2).float() / d)
            emb = torch.cat((angle, angle), dim=-1).to(device)
            cos, sin = emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)
            blocks, block_size = 6, 4
            slots = torch.randperm(blocks * block_size, generator=g)[:m].to(device)
            want_k, want_v, k, v = (
                torch.zeros(blocks, block_size, kv_heads, d, dtype=dtype, device=device) for _ in range(4)
            )
            h_want, qkv = attention_qkv(h, delta, nw, 1e-6, w, b)
            q_want = rope_kv_write(qkv, cos, sin, slots, want_k, want_v, heads, kv_heads, d)
            pool = RopeKV(cos, sin, slots, k, v, heads, kv_heads, d)
            h_new, q = norm_linear_rope_kv(h, delta, nw, 1e-6, w, b, pool, **kw)
            close = dict(rtol=tol, atol=tol)
            if dtype == torch.float32:
                assert torch.equal(h_new, h_want), "the residual stream is eager's h + delta"
            assert q.shape == (m, heads, d)
            torch.testing.assert_close(q, q_want, **close)
            torch.testing.assert_close(k, want_k, **close)
            torch.testing.assert_close(v, want_v, **close)
            others = torch.ones(blocks * block_size, dtype=torch.bool, device=device)
            others[slots] = False
            for cache in (k, v):
                assert (cache.view(-1, kv_heads, d)[others] == 0).all(), "only the rows' own slots are written"
    print("ok")
    """
)


def test_rope_and_the_pool_write_in_the_qkv_launch_equal_the_two_launch_path_under_the_interpreter():
    run_interpreted(CHECK)


@pytest.mark.gpu
def test_rope_and_the_pool_write_in_the_qkv_launch_equal_the_two_launch_path_on_the_gpu():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _pool(**change):
    t, heads, kv_heads, d = 2, 4, 2, 8
    kw = dict(
        cos=torch.zeros(t, 1, d),
        sin=torch.zeros(t, 1, d),
        slots=torch.zeros(t, dtype=torch.long),
        k_cache=torch.zeros(3, 4, kv_heads, d),
        v_cache=torch.zeros(3, 4, kv_heads, d),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=d,
    )
    return RopeKV(**(kw | change))


@pytest.mark.parametrize(
    "pool, width, message",
    [
        (_pool(), 48, "qkv must be"),  # 48 outputs are not (4 + 2·2)·8 = 64
        (_pool(head_dim=7, cos=torch.zeros(2, 7), sin=torch.zeros(2, 7)), 56, "even head_dim"),
        (_pool(slots=torch.zeros(3, dtype=torch.long)), 64, "slots"),
        (_pool(cos=torch.zeros(2, 1, 4)), 64, "cos must be"),
        (_pool(k_cache=torch.zeros(3, 4, 1, 8)), 64, "k_cache must be"),
    ],
)
def test_shapes_rope_or_the_pool_cannot_take_are_refused_before_any_launch(pool, width, message):
    h = torch.zeros(2, 16)
    with pytest.raises(ParameterError, match=message):
        norm_linear_rope_kv(h, None, torch.ones(16), 1e-6, torch.zeros(width, 16), None, pool)


def test_an_odd_block_n_cannot_hold_ropes_pairs():
    h, w = torch.zeros(1, 16), torch.zeros(64, 16)
    with pytest.raises(ParameterError, match="even"):
        norm_linear_rope_kv(
            h,
            None,
            torch.ones(16),
            1e-6,
            w,
            None,
            _pool(cos=torch.zeros(1, 8), sin=torch.zeros(1, 8), slots=torch.zeros(1, dtype=torch.long)),
            block_n=3,
        )
