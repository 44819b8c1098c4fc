"""Split-KV inside the ragged kernel: long-context tiles of a mixed step cut into chunks, one program each, merged.

The plan (which tiles split, how many ways, within a fixed budget of columns) is checked on the host; the Triton
kernel is checked against ``ragged_reference`` under Triton's interpreter, in a child process (the interpreter is
chosen when the kernel is defined): float32 and float16, head_dim 64 and 80 (padded), grouped-query attention, a
decode over a few thousand keys next to short decodes and a prefill chunk; and an engine whose whole-step graphs
(uncaptured) split every long-enough tile still gives HF's greedy tokens.
"""

import textwrap

import torch
from interpreted import run_interpreted

from servelab.kernels.ragged import (
    SPLIT,
    SPLITS,
    RaggedTiles,
    max_long_tiles,
    max_tiles,
    plan_splits,
    plan_tiles,
    ragged_reference,
    ragged_tile_tokens,
    split_budget,
)
from servelab.kernels.split_kv import MAX_SPLITS, MIN_SPLIT_KEYS, decode_splits

# (tokens, first position) per sequence: a decode over 2,048 keys, short decodes, a chunk after 20 cached tokens, a
# chunk after 900 keys
LONG_RUNS = [(1, 2047), (1, 5), (20, 20), (1, 300), (3, 900)]
# the same mix at a tenth of the length, for 16-key splits; its chunk starts at 21, so that with one KV head (4-token
# tiles) the tile at positions 29-32 splits 2 ways at key 32 and its rows at 29-31 see no key of its second split
SHORT_RUNS = [(1, 150), (1, 5), (20, 21), (3, 60)]


def split_case(
    heads, kv_heads, d, bs, runs, *, budget, min_keys=MIN_SPLIT_KEYS, dtype=torch.float32, seed=0, long_tile_tokens=0,
    sms=None,
):  # fmt: skip
    """A step of ``runs`` over a random paged pool, its tiles planned with ``budget`` split columns (and long tiles
    of ``long_tile_tokens``, 0: none) for a GPU of ``sms`` SMs."""
    g = torch.Generator().manual_seed(seed)
    width = -(-max(n + p for n, p in runs) // bs)
    blocks = width * len(runs)
    kp = torch.randn(blocks, bs, kv_heads, d, generator=g).to(dtype)
    vp = torch.randn(blocks, bs, kv_heads, d, generator=g).to(dtype)
    tables = torch.randperm(blocks, generator=g).view(len(runs), width)
    spans, start = [], 0
    for row, (n, pos) in enumerate(runs):
        spans.append((row, start, n, pos))
        start += n
    tt = ragged_tile_tokens(heads, kv_heads)
    packed, long = plan_tiles(spans, tt, long_tile_tokens)
    packed, columns = plan_splits(packed, budget, kv_heads, sms, min_keys=min_keys)
    tiles = torch.zeros(4, max_tiles(start + 3, len(runs), tt), dtype=torch.long)
    tiles[:, : len(packed)] = torch.tensor(packed).t()
    split = torch.zeros(6, budget, dtype=torch.long)
    if columns:
        split[:, : len(columns)] = torch.tensor(columns).t()
    long_tiles = torch.zeros(4, max_long_tiles(start + 3, long_tile_tokens), dtype=torch.long)
    if long:
        long_tiles[:, : len(long)] = torch.tensor(long).t()
    q = torch.randn(start + 3, heads, d, generator=g).to(dtype)  # 3 padding tokens, in no tile
    rt = RaggedTiles(tiles, tables, tt, long_tiles if long_tile_tokens else None, long_tile_tokens, split)
    return q, kp, vp, rt, columns


# the GPU test's mixed step (test_gpu_engine): a decode over 16K keys, short decodes, a 40-token chunk after 4K
# cached keys, a 300-token prompt (long tiles), in (tokens, cached keys)
LONG_CONTEXT_RUNS = [(1, 16383), (1, 100), (1, 5000), (40, 4000), (300, 0), (1, 700)]


def test_the_gpu_tests_long_context_step_splits_its_16k_decode_at_132_sms():
    """What the GPU test takes as given, checked here at the H100's and H200's SM count: with 16-row packed tiles
    the 40-token chunk is 20 tiles of 4K keys, so the 64 split columns go 6 to each of the longest tiles (the 16K
    decode first), where the 128-row tiles gave the 16K decode more than 8 (the GPU test asked > 8 and failed in
    3 of 3 runs on an H100, 2026-12-07)."""
    budget = split_budget(2, 16384, 132)
    *_, cols = split_case(14, 2, 64, 16, LONG_CONTEXT_RUNS, budget=budget, long_tile_tokens=128, sms=132)
    first = [c for c in cols if c[SPLIT] == 0]
    assert first[0][:4] == (0, 0, 1, 16383) and first[0][SPLITS] == 6
    assert len(cols) == budget == 64 and len(first) == 11  # the 5K decode and nine chunk tiles split too


def test_the_longest_tiles_split_within_the_budget():
    packed = [(0, 0, 1, 8000), (1, 1, 1, 100), (2, 2, 16, 3000), (3, 18, 1, 600), (4, 19, 1, 400)]
    left, cols = plan_splits(packed, 64, kv_heads=2, sms=132)
    # three tiles reach 2 × 256 keys; decode_splits over 3 long tiles: 44 to fill, capped by each tile's length
    first = [c for c in cols if c[SPLIT] == 0]
    assert [c[:4] for c in first] == [(0, 0, 1, 8000), (2, 2, 16, 3000), (3, 18, 1, 600)]
    assert [c[SPLITS] for c in first] == [31, 11, 2] and len(cols) == 44
    assert left == [(1, 1, 1, 100), (4, 19, 1, 400)]  # order kept
    # every tile's columns are its splits 0 … S-1, in order
    assert [c[SPLIT] for c in cols] == list(range(31)) + list(range(11)) + list(range(2))
    # a small budget goes to the longest tile first; what cannot split at least 2 ways stays packed
    left, cols = plan_splits(packed, 32, kv_heads=2, sms=132)
    assert {c[SPLITS] for c in cols} == {31} and len(left) == 4
    assert plan_splits(packed, 0, kv_heads=2) == (packed, [])
    # short contexts never split
    short = [(0, 0, 1, 2 * MIN_SPLIT_KEYS - 2), (1, 1, 16, 100)]
    assert plan_splits(short, 64, kv_heads=2) == (short, [])


def test_the_budget_is_one_decode_of_the_longest_context():
    assert split_budget(2, 16384, 132) == MAX_SPLITS == decode_splits(1, 2, 16384, 132)
    assert split_budget(2, 2048, 132) == 8
    assert split_budget(2, 2 * MIN_SPLIT_KEYS - 1, 132) == 0  # a graph over short contexts has no split program
    assert split_budget(2, 64, 132, min_keys=16) == 4


def test_the_reference_reads_a_split_tile_once():
    q, kp, vp, rt, cols = split_case(4, 2, 16, 16, LONG_RUNS, budget=160, min_keys=16)
    assert len({c[:4] for c in cols}) >= 2  # the decode and a chunk split
    unsplit = RaggedTiles(rt.tiles.clone(), rt.block_tables, rt.tile_tokens)
    first = [c[:4] for c in cols if c[SPLIT] == 0]
    at = int((unsplit.tiles[2] > 0).sum())
    unsplit.tiles[:, at : at + len(first)] = torch.tensor(first).t()
    torch.testing.assert_close(ragged_reference(q, kp, vp, rt, 0.25), ragged_reference(q, kp, vp, unsplit, 0.25))


KERNEL_CHECK = textwrap.dedent("""
    import torch
    import tests.test_ragged_split as t
    from servelab.kernels.ragged import SPLIT, SPLITS, ragged_reference
    from servelab.kernels.triton_ragged import triton_ragged

    def check(shape, runs, budget, min_keys, dtype, tol, keys):
        heads, kv_heads, d, bs = shape
        q, kp, vp, rt, cols = t.split_case(*shape, runs, budget=budget, min_keys=min_keys, dtype=dtype)
        assert max(c[SPLITS] for c in cols) > 2, cols  # the long tiles really split
        ref = ragged_reference(q.float(), kp.float(), vp.float(), rt, d ** -0.5)
        got = triton_ragged(q, kp, vp, rt, d ** -0.5, keys=keys).float()
        torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
        return q, kp, vp, rt, cols

    # a decode over 2,048 keys (8 splits of 256 keys), GQA, head_dim 64 and 80 (padded to 128)
    check((4, 2, 64, 16), t.LONG_RUNS, 16, 256, torch.float32, 1e-5, 64)
    check((2, 1, 80, 16), t.LONG_RUNS, 16, 256, torch.float32, 1e-5, 64)
    # half precision: float16 (Triton 3.9's interpreter misreads bfloat16 tensors; the GPU test runs bf16)
    check((4, 2, 64, 16), t.SHORT_RUNS, 24, 16, torch.float16, 2e-3, 16)
    # 16-key splits, one KV head: a chunk whose early rows see no key of its later split, empty trailing splits
    q, kp, vp, rt, cols = check((4, 1, 16, 16), t.SHORT_RUNS, 24, 16, torch.float32, 1e-5, 16)
    chunk = lambda c: 16 * -(-(c[2] + c[3]) // c[SPLITS] // 16)  # the kernel's chunk for 16-key tiles
    assert any(c[2] > 1 and 0 < c[SPLIT] and c[3] < c[SPLIT] * chunk(c) < c[2] + c[3] for c in cols)
    assert any(c[SPLIT] * chunk(c) >= c[2] + c[3] for c in cols)
    rt.split_counters = torch.zeros(24, dtype=torch.int32)
    for _ in range(2):  # the merging programs put a shared counter buffer back to 0: the second call is exact too
        torch.testing.assert_close(triton_ragged(q, kp, vp, rt, 0.25, keys=16), ragged_reference(q, kp, vp, rt, 0.25))
        assert (rt.split_counters == 0).all()
    print("ok")
""")


def test_split_tiles_match_the_reference_under_the_interpreter():
    run_interpreted(KERNEL_CHECK)


ENGINE_CHECK = textwrap.dedent("""
    import torch
    import servelab.engine.step_graphs as sg
    from servelab.engine import Engine, EngineConfig, SamplingParams
    from servelab.models import load_model
    from tests.test_engine_async import hf_greedy

    torch.manual_seed(0)
    hf = load_model("config:tiny-llama", dtype="float32", device="cpu").model
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (45, 3, 21)]
    refs = hf_greedy(hf, prompts, 6)
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=24))
    runner = engine.runner
    runner.enable_step_graphs((8, 16, 24), capture=False)
    # 8-key splits: every tile over 16 keys splits (chunks after cached context, decodes), as 512+ do by default
    runner.step_graphs = sg.StepGraphs(
        engine.model, engine.pool, runner.tables, sizes=(8, 16, 24), max_seqs=4, scratch_block=runner.scratch_block,
        min_split_keys=8,
    )
    planned = []
    plan = sg.plan_splits
    sg.plan_splits = lambda *a, **k: planned.append(plan(*a, **k)[1]) or plan(*a, **k)
    assert engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True)) == refs
    assert runner.step_graph_steps == engine.steps and runner.eager_steps == 0
    split_steps = [cols for cols in planned if cols]
    assert len(split_steps) >= 5 and any(c[2] > 1 for cols in split_steps for c in cols), planned  # chunks too
    assert (runner.step_graphs.split_counters == 0).all()
    print("ok")
""")


def test_a_step_graph_engine_with_split_tiles_gives_hf_greedy_tokens():
    run_interpreted(ENGINE_CHECK)


def test_split_kv_in_step_graphs_follows_the_engine_flag():
    """Off by default (the merge has not run on a GPU yet): no split columns, every tile in one program; on, a table
    wide enough to split gets the budget ``split_budget`` gives."""
    from servelab.engine import Engine, EngineConfig
    from servelab.models import load_model

    hf = load_model("config:tiny-llama", dtype="float32", device="cpu").model
    widths = {}
    for on in (False, True):
        cfg = EngineConfig(
            block_size=16, num_blocks=2048, max_num_seqs=4, max_num_batched_tokens=64, ragged_split_kv=on
        )
        engine = Engine.from_hf(hf, cfg)
        engine.runner.enable_step_graphs((16, 64), capture=False, split_kv=cfg.ragged_split_kv)
        widths[on] = engine.runner.step_graphs.split_columns
        assert engine.stats()["ragged_split_kv"] is on
    assert widths[False] == 0 and widths[True] > 1, widths
