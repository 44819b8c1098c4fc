"""The staged long-tile kernel (``kernels/triton_long_tiles.py``, issue 29) against ``ragged_reference``.

Under Triton's interpreter, in a child process (the interpreter is chosen when a kernel is defined), with 16-token
long tiles and 16- or 32-key iterations so it runs in seconds. Each case's runs start where the kernel's cut
between unmasked and diagonal key tiles is easiest to get wrong: at position 0, one and two before a multiple of
the key tile, after cached context, with lengths that are no multiple of the tile; a short run (packed, not the
kernel's) and the table's empty padding tiles must be left alone. float16 stands for the low-precision path:
the interpreter computes bfloat16 dot products wrongly (``triton_ragged`` too), float16 right.
"""

import textwrap

import pytest
import torch
from interpreted import run_interpreted, run_script_interpreted

from servelab.kernels.ragged import RaggedTiles, max_long_tiles, plan_tiles, ragged_reference

LONG = 16  # tokens per long tile in these tests (the engine's is 128)


def runs_for(block_n: int) -> list[tuple[int, int]]:
    """(tokens, first position) per sequence: a fresh prompt of 2 tiles and a 5-token tail; runs whose tiles start
    one (then 2N - 1) and two before a multiple of the key tile ``block_n``; a chunk after 50 cached tokens whose
    last tile has 1 token; a short run, which goes to the packed tiles and is not this kernel's."""
    n = block_n
    return [(37, 0), (20, n - 1), (16, n - 2), (33, 50), (18, 2 * n - 1), (5, 9)]


def long_case(heads, kv_heads, d, bs, block_n, *, seed=0, padding=3, dtype=torch.float32):
    """(q, K pool, V pool, long tiles, block tables, RaggedTiles of the long tiles alone) over ``runs_for``."""
    g = torch.Generator().manual_seed(seed)
    spec = runs_for(block_n)
    width = -(-max(n + p for n, p in spec) // bs)
    pool_blocks = len(spec) * width
    kp = torch.randn(pool_blocks, bs, kv_heads, d, generator=g)
    vp = torch.randn_like(kp)
    tables = torch.stack([torch.randperm(pool_blocks, generator=g)[:width] for _ in spec])
    runs, start = [], 0
    for row, (n, pos) in enumerate(spec):
        runs.append((row, start, n, pos))
        start += n
    _, long = plan_tiles(runs, 8, LONG)
    tiles = torch.zeros(4, max_long_tiles(start + padding, LONG) + 3, dtype=torch.long)
    tiles = tiles[:, : tiles.shape[1] - 3]  # a strided view, as the step graphs' buffer is
    tiles[:, : len(long)] = torch.tensor(long).t()
    assert tiles.shape[1] > len(long)  # empty padding tiles too
    q = torch.randn(start + padding, heads, d, generator=g)
    rt = RaggedTiles(torch.zeros(4, 0, dtype=torch.long), tables, 8, tiles, LONG)
    return q.to(dtype), kp.to(dtype), vp.to(dtype), tiles, tables, rt


CHECK = textwrap.dedent("""
    import torch
    import test_long_tile_attention as t
    from servelab.kernels.ragged import ragged_reference
    from servelab.kernels.triton_long_tiles import long_tile_attention
    heads, kv_heads, d, bs, block_n, dtype, atol = {case}
    dtype = getattr(torch, dtype)
    scale = 0.7 * d ** -0.5
    q, kp, vp, tiles, tables, rt = t.long_case(heads, kv_heads, d, bs, block_n, dtype=dtype)
    want = ragged_reference(q.float(), kp.float(), vp.float(), rt, scale)
    got = long_tile_attention(q, kp, vp, tiles, tables, t.LONG, scale, block_n=block_n)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=0, atol=atol)
    # into a given buffer: the long tiles' rows written, every other row (short run, padding tokens) untouched
    out = torch.full_like(q, 7.0)
    assert long_tile_attention(q, kp, vp, tiles, tables, t.LONG, scale, out, block_n=block_n) is out
    mine = want.abs().sum((1, 2)) > 0
    assert mine.sum() == sum(n for n, _ in t.runs_for(block_n)[:-1])
    torch.testing.assert_close(out[mine].float(), want[mine], rtol=0, atol=atol)
    assert (out[~mine] == 7.0).all()
    print("ok")
""")

CASES = {  # heads, KV heads, head_dim, block_size, keys per iteration, dtype, atol
    "groups7-d64-bs16": (14, 2, 64, 16, 16, "float32", 1e-5),
    "groups1-d64-bs4": (4, 4, 64, 4, 16, "float32", 1e-5),
    "groups4-d40-bs4": (8, 2, 40, 4, 16, "float32", 1e-5),  # head axis padded to 64
    "groups2-d80-bs16-keys32": (4, 2, 80, 16, 32, "float32", 1e-5),  # padded to 128; a key tile of 2 long tiles
    "groups7-d64-bs16-fp16": (14, 2, 64, 16, 16, "float16", 3e-3),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_long_tiles_match_the_reference_under_the_interpreter(case):
    run_interpreted(CHECK.format(case=case))


def test_the_cases_cross_the_unmasked_diagonal_cut_where_an_off_by_one_would_show():
    """Tiles whose first position is one and two before a multiple of the key tile, and one at a multiple."""
    for block_n in (16, 32):
        *_, tiles, _, _ = long_case(4, 2, 16, 4, block_n)
        first = {int(p) % block_n for p, n in zip(tiles[3].tolist(), tiles[2].tolist(), strict=True) if n}
        assert {block_n - 1, block_n - 2, 0} <= first


def test_the_reference_of_the_long_tiles_alone_leaves_other_rows_zero():
    q, kp, vp, tiles, tables, rt = long_case(4, 2, 16, 4, 16)
    out = ragged_reference(q, kp, vp, rt, 0.25)
    short = sum(n for n, _ in runs_for(16)[:-1])
    assert (out[:short].abs().sum((1, 2)) > 0).all() and (out[short:] == 0).all()


def test_bad_arguments_are_refused_before_any_launch():
    pytest.importorskip("triton")
    from servelab.kernels.triton_long_tiles import long_tile_attention

    q, kp, vp, tiles, tables, _ = long_case(4, 2, 16, 4, 16)
    with pytest.raises(ValueError, match="long_tile_tokens=24 must be a power of two"):
        long_tile_attention(q, kp, vp, tiles, tables, 24, 0.25)
    with pytest.raises(ValueError, match="block_n=8 must be a power of two >= 16"):
        long_tile_attention(q, kp, vp, tiles, tables, LONG, 0.25, block_n=8)
    with pytest.raises(ValueError, match="head_dim 32 does not match the KV pool's 16"):
        long_tile_attention(torch.zeros(q.shape[0], 4, 32), kp, vp, tiles, tables, LONG, 0.25)
    with pytest.raises(ValueError, match="5 query heads are not a multiple of 2 KV heads"):
        long_tile_attention(torch.zeros(q.shape[0], 5, 16), kp, vp, tiles, tables, LONG, 0.25)
    with pytest.raises(ValueError, match="long_tiles must be"):
        long_tile_attention(q, kp, vp, tiles[:3], tables, LONG, 0.25)
    with pytest.raises(ValueError, match="out must be"):
        long_tile_attention(q, kp, vp, tiles, tables, LONG, 0.25, out=torch.zeros(3, 4, 16))


def test_the_bench_smoke_run_writes_its_rows(tmp_path):
    out = tmp_path / "x.csv"
    run_script_interpreted("bench_long_tiles.py", "--smoke", "--out", str(out))
    import pandas as pd

    table = pd.read_csv(out)
    assert len(table) and (table["status"] == "ok").all(), table.get("note")
    assert set(table["path"]) >= {"triton_ragged", "long_tile_attention"}
    assert (table["ms"] > 0).all() and (table["floor_ms"] > 0).all()
    assert (table["max_abs_diff"] < 1e-4).all()  # float32 on the CPU: both kernels agree to rounding
    assert out.with_suffix(".device.json").exists()


def test_the_default_launch_keeps_its_tiles_in_sm90s_shared_memory():
    """The q, K, V and probability tiles must fit 232,448 bytes: an H100 refused 262,144 for float32 at head_dim 80
    with 128 keys (the formula's number), in the quick GPU tier's float32 engines."""
    from servelab.kernels.triton_long_tiles import SHARED_LIMIT, default_launch, shared_bytes

    assert shared_bytes(80, 128, 128, 4) == 262_144 > SHARED_LIMIT  # what the H100 refused
    assert default_launch(64, 128) == default_launch(128, 128) == (128, 8, 3)  # bf16: the H100 sweep's best
    assert default_launch(80, 128, elem_bytes=4) == (64, 8, 2)
    assert default_launch(64, 64) == (64, 4, 3)
    for d in (32, 64, 80, 96, 128, 160, 256):
        for elem in (2, 4):
            for tokens in (64, 128):
                keys, _, _ = default_launch(d, tokens, elem)
                assert keys >= 16 and shared_bytes(d, tokens, keys, elem) <= SHARED_LIMIT, (d, elem, tokens)
