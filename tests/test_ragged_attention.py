"""Ragged paged attention: one call for a step's decodes, fresh prefills and chunks after cached context.

The PyTorch reference is checked against dense causal attention computed independently; the Triton
kernel (when Triton is installed) is checked against the reference under Triton's interpreter, in a
child process because the interpreter is chosen when the kernel is defined.
"""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

from servelab.engine import EngineConfig
from servelab.engine.step_graphs import StepGraphs, step_graph_sizes
from servelab.errors import ParameterError
from servelab.kernels.ragged import (
    RaggedTiles,
    max_long_tiles,
    max_tiles,
    plan_tiles,
    ragged_reference,
    ragged_tile_tokens,
)

# (tokens, first position) per sequence: a decode deep in its context, a fresh prompt, a chunk after 50
# cached tokens, a decode at position 0
RUNS = [(1, 70), (37, 0), (20, 50), (1, 0)]


def paged_case(heads, kv_heads, d, bs, *, seed=0, padding=5, long_tile_tokens=0):
    g = torch.Generator().manual_seed(seed)
    kp = torch.randn(60, bs, kv_heads, d, generator=g)
    vp = torch.randn_like(kp)
    width = -(-max(n + p for n, p in RUNS) // bs)
    tables = torch.stack([torch.randperm(60, generator=g)[:width] for _ in RUNS])
    runs, start = [], 0
    for row, (n, pos) in enumerate(RUNS):
        runs.append((row, start, n, pos))
        start += n
    tt = ragged_tile_tokens(heads, kv_heads)
    packed, long = plan_tiles(runs, tt, long_tile_tokens)
    n_tiles, n_long = max_tiles(start + padding, 8, tt), max_long_tiles(start + padding, long_tile_tokens)
    tables_ = []
    for planned, width in [(packed, n_tiles), (long, n_long)]:
        t = torch.zeros(4, width + 3, dtype=torch.long)[:, :width]  # a strided view, as in the graphs' buffer
        if planned:
            t[:, : len(planned)] = torch.tensor(planned).t()
        tables_.append(t)
    q = torch.randn(start + padding, heads, d, generator=g)
    return (
        q,
        kp,
        vp,
        RaggedTiles(tables_[0], tables, tt, tables_[1] if long_tile_tokens else None, long_tile_tokens),
        runs,
    )


def dense(q, kp, vp, tables, row, start, n, pos):
    heads, d = q.shape[1:]
    kv_heads, bs = kp.shape[2], kp.shape[1]
    keys = pos + n
    blocks = tables[row, : -(-keys // bs)]
    k = kp[blocks].flatten(0, 1)[:keys].repeat_interleave(heads // kv_heads, 1)
    v = vp[blocks].flatten(0, 1)[:keys].repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("thd,lhd->htl", q[start : start + n], k) * d**-0.5
    visible = torch.arange(keys)[None, :] <= (pos + torch.arange(n))[:, None]
    return torch.einsum("htl,lhd->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("long_tile_tokens", [0, 16])
@pytest.mark.parametrize("heads,kv_heads,d,bs", [(14, 2, 64, 16), (4, 4, 16, 4), (6, 2, 32, 16)])
def test_reference_is_causal_paged_attention_per_sequence(heads, kv_heads, d, bs, long_tile_tokens):
    q, kp, vp, rt, runs = paged_case(heads, kv_heads, d, bs, long_tile_tokens=long_tile_tokens)
    out = ragged_reference(q, kp, vp, rt, d**-0.5)
    for row, start, n, pos in runs:
        torch.testing.assert_close(
            out[start : start + n], dense(q, kp, vp, rt.block_tables, row, start, n, pos), rtol=1e-5, atol=1e-5
        )
    assert (out[sum(n for n, _ in RUNS) :] == 0).all()  # padding tokens belong to no tile


def test_tiles_split_runs_and_fit_the_fixed_width():
    packed, long = plan_tiles([(3, 0, 1, 99), (5, 1, 40, 8)], 16)
    assert packed == [(3, 0, 1, 99), (5, 1, 16, 8), (5, 17, 16, 24), (5, 33, 8, 40)] and long == []
    assert len(packed) <= max_tiles(41, 2, 16)
    packed, long = plan_tiles([(3, 0, 1, 99), (5, 1, 40, 8), (6, 41, 20, 0)], 16, long_tile_tokens=32)
    assert packed == [(3, 0, 1, 99), (6, 41, 16, 0), (6, 57, 4, 16)] and long == [(5, 1, 32, 8), (5, 33, 8, 40)]
    assert len(long) <= max_long_tiles(61, 32)
    # tile rows = tokens x padded query-head group: 16, the fewest the matrix units take (a decode fills one token's)
    assert ragged_tile_tokens(14, 2) == 2 and ragged_tile_tokens(32, 8) == 4
    assert ragged_tile_tokens(4, 4) == 16 and ragged_tile_tokens(12, 12) == 16  # one head a KV head
    assert ragged_tile_tokens(32, 1) == 1  # a group of 32 padded rows: one token a tile


def test_step_buckets_and_bad_sizes():
    assert step_graph_sizes(512)[-1] == 512 and step_graph_sizes(600)[-2:] == [512, 600]
    with pytest.raises(ParameterError, match="step_graph_sizes"):
        EngineConfig(max_num_batched_tokens=256, step_graph_sizes=(16, 512))
    with pytest.raises(ParameterError, match="step_graphs"):
        EngineConfig(step_graphs="yes")


def test_a_step_larger_than_every_bucket_is_left_to_the_eager_path():
    from servelab.engine import Engine, SamplingParams

    engine = Engine.from_spec(
        "config:tiny-llama",
        dtype="float32",
        device="cpu",
        config=EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64),
    )
    engine.runner.enable_step_graphs([8], capture=False)
    engine.generate([list(range(5, 30))], SamplingParams(max_tokens=3, ignore_eos=True))
    assert engine.runner.eager_steps == 1 and engine.runner.step_graph_steps == 2  # the 25-token prefill ran eagerly
    assert isinstance(engine.runner.step_graphs, StepGraphs)


KERNEL_CHECK = textwrap.dedent("""
    import torch
    import tests.test_ragged_attention as t
    from servelab.kernels.ragged import ragged_reference
    from servelab.kernels.triton_ragged import triton_ragged
    # head_dim 80 and 96: padded to 128 and masked inside the kernel
    for shape, long in [((14, 2, 64, 16), 16), ((4, 4, 16, 4), 0), ((4, 1, 16, 8), 32), ((4, 2, 80, 8), 16),
                        ((6, 2, 96, 16), 0)]:
        q, kp, vp, rt, runs = t.paged_case(*shape, long_tile_tokens=long)
        got = triton_ragged(q, kp, vp, rt, shape[2] ** -0.5, keys=16)
        torch.testing.assert_close(got, ragged_reference(q, kp, vp, rt, shape[2] ** -0.5), rtol=1e-5, atol=1e-5)
    print("ok")
""")


def test_triton_kernel_matches_the_reference_under_the_interpreter():
    run_interpreted(KERNEL_CHECK)
