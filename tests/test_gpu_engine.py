"""The engine's captured paths on a CUDA device (skipped without one; run on the H200 by the GPU scripts).

In float32 the engine with decode graphs and whole-step graphs (ragged Triton attention) must give HF's
greedy tokens, under chunked prefill and with the prefix cache, as the CPU tests require of the eager path;
also at head_dim 80 (padded inside the kernels), and with split-KV decode over a long context, in the decode
kernel and in the ragged kernel of a captured mixed step.

Every test here is marked ``gpu``; those marked ``gpu_quick`` too are the quick tier (``make gpu-test-quick``): one
cheap case of each captured path, at shapes whose Triton kernels and compiled blocks other quick tests build anyway.
"""

import gc

import pytest
import torch
from hf_reference import hf_greedy, varied, varies

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.models import load_model

pytestmark = pytest.mark.gpu

STEPS = 10
GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)
FAMILIES = ("tiny-qwen2", "tiny-llama", "tiny-gpt2", "tiny-llama-hd80")
POLICIES = (("chunked_prefill", 64), ("chunked_prefill", 160), ("eager_cont_batch", 512))
# the quick tier's cases of the family test: decode graphs and whole-step graphs (chunked prefill, mixed steps) in
# every family at budget 64, and long tiles after cached context once (budget 160)
QUICK_FAMILY_CASES = {("chunked_prefill", 64, f) for f in FAMILIES} | {("chunked_prefill", 160, "tiny-llama")}
# the long-context split test's prompts and engine (tests/test_split_plan_replay.py checks on a CPU that they give a
# split chunk and a split decode inside whole-step graphs)
SPLIT_PROMPTS = (1100, 6, 19, 450, 45)
SPLIT_CONFIG = dict(
    block_size=16, num_blocks=512, max_num_seqs=4, max_num_batched_tokens=512, scheduler="chunked_prefill"
)


def family_config(policy: str, budget: int) -> dict:
    return dict(block_size=4, num_blocks=512, max_num_seqs=4, max_num_batched_tokens=budget, scheduler=policy)


def engine_is_idle(engine) -> bool:
    """Nothing queued, running or in flight; every block-table row and KV block given back."""
    return (
        not engine.has_unfinished()
        and not engine.leaked()
        and not engine.runner.tables.row_of
        and engine.block_manager.num_used_blocks == 0
    )


def step_counts(engine) -> dict:
    st = engine.stats()
    return {k: st[k] for k in ("graph_steps", "step_graph_steps", "eager_steps")}


def ran_since(engine, before: dict) -> dict:
    """Steps of each kind the engine ran since ``before`` (its counters cover its whole life)."""
    return {k: v - before[k] for k, v in step_counts(engine).items()}


@pytest.fixture(scope="module")
def shared_engine():
    """``shared_engine(family, **config)``: a float32 ``(hf, engine)`` built once for this module per family and
    config, so a second test with the same ones skips the build (the compile check, every decode-graph and
    whole-step-graph capture). The quick split-KV case runs on the hd80 family test's engine this way.

    Why sharing is safe here: the tests that take an engine from this fixture only call ``generate`` on it, which
    runs every request to the end, and they sample greedily (no random state). What one leaves for the next is
    what a serving engine leaves between two batches of requests (the benchmark reuses its engines the same way):
    free KV blocks whose stale bytes are written before they are read, block-table rows given back, nothing in
    flight, and no prefix cache (no test asks for one here). An engine that is not idle (a test failed mid-run) is
    never handed out again: it is built anew. Step counters span the engine's life, so tests read differences
    (``ran_since``). The engines are freed at the module's end."""
    built = {}

    def get(family: str, **config):
        key = (family, tuple(sorted(config.items())))
        if key not in built or not engine_is_idle(built[key][1]):
            built.pop(key, None)
            # varied weights: at the loader's init tiny-qwen2 and tiny-gpt2 repeat one token for every prompt
            hf = varied(family).cuda()
            built[key] = hf, Engine.from_hf(hf, EngineConfig(**config))
        return built[key]

    yield get
    built.clear()
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "policy,budget,family",
    [
        pytest.param(
            policy,
            budget,
            family,
            marks=[pytest.mark.gpu_quick] if (policy, budget, family) in QUICK_FAMILY_CASES else [],
            id=f"{policy}-{budget}-{family}",
        )
        for policy, budget in POLICIES
        for family in FAMILIES
    ],
)
def test_captured_steps_give_hf_greedy_tokens_in_float32(shared_engine, policy, budget, family):
    """Budgets of 160 and 512 put runs of 128 tokens or more (long tiles) in the steps, after cached context too."""
    hf, engine = shared_engine(family, **family_config(policy, budget))
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (6, 19, 33, 2, 45, 300)]
    assert engine.step_graphs_status.startswith("on"), engine.step_graphs_status
    before = step_counts(engine)
    refs = hf_greedy(hf, prompts, STEPS)
    assert varies(refs), refs
    assert engine.generate(prompts, GREEDY) == refs
    ran = ran_since(engine, before)
    # the last prompt's final decodes run alone: decode-only steps, in decode graphs
    assert ran["step_graph_steps"] > 0 and ran["graph_steps"] > 0 and ran["eager_steps"] == 0, ran


@pytest.mark.gpu_quick
def test_captured_steps_with_prefix_hits_match_the_uncached_engine():
    hf = load_model("config:tiny-llama", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(3)
    system = torch.randint(3, hf.config.vocab_size, (37,), generator=g).tolist()
    prompts = [system + torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 1, 20)]
    cfg = dict(block_size=4, num_blocks=256, max_num_seqs=4, max_num_batched_tokens=32)
    ref = Engine.from_hf(hf, EngineConfig(**cfg, step_graphs=False)).generate(prompts, GREEDY)
    engine = Engine.from_hf(hf, EngineConfig(**cfg, prefix_caching=True))
    assert engine.generate(prompts, GREEDY) == ref
    assert engine.generate(prompts, GREEDY) == ref  # warm: chunks after cached context, copy-on-write
    assert engine.stats()["prefix_hit_tokens"] > 0 and engine.stats()["step_graph_steps"] > 0


@pytest.mark.parametrize(
    "head_dim,dtype,pinned",
    [
        (64, torch.float32, False),
        (80, torch.float32, False),
        (128, torch.bfloat16, False),
        # the engine's bf16 launch: the device's measured tile, warps and stages, which split programs take too
        (64, torch.bfloat16, True),
    ],
)
def test_compiled_split_kv_decode_matches_gather_at_long_contexts(head_dim, dtype, pinned, monkeypatch):
    from servelab.kernels import triton_decode as td
    from servelab.kernels.decode import gather_decode
    from servelab.kernels.decode_launch import device_slug
    from servelab.kernels.split_kv import decode_splits
    from servelab.kernels.triton_decode import sm_count, triton_decode

    monkeypatch.setattr(td, "_PINNED", {})
    monkeypatch.setattr(td, "_TUNED", {})
    if pinned and td.pin_measured_launch(device_slug("cuda"), 14, 2, head_dim, 16, dtype) is None:
        pytest.skip(f"no measured decode launch for {device_slug('cuda')}")
    g = torch.Generator(device="cuda").manual_seed(0)
    heads, kv_heads, block_size = 14, 2, 16
    lens = torch.tensor([1, 300, 4097, 16384], device="cuda")
    width = 16384 // block_size
    blocks = len(lens) * width
    kp = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    vp = torch.randn_like(kp)
    tables = torch.randperm(blocks, device="cuda", generator=g).view(len(lens), width)
    q = torch.randn(len(lens), heads, head_dim, device="cuda", dtype=dtype, generator=g)
    assert decode_splits(len(lens), kv_heads, width * block_size, sm_count("cuda")) > 1  # the split path runs
    ref = gather_decode(q.float(), kp.float(), vp.float(), tables, lens, head_dim**-0.5)
    got = triton_decode(q, kp, vp, tables, lens, head_dim**-0.5).float()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "config",
    [
        # quick: the hd80 family test's engine (block size 4, budget 64), shared: no build, no new kernel tuning
        pytest.param(family_config("chunked_prefill", 64), marks=pytest.mark.gpu_quick, id="block4-budget64"),
        # full: block size 16 (a decode-kernel tuning of its own at head_dim 80) and the default budget (8192: every
        # whole-step graph size up to it captured); 87 s on the H200 (data/results/nvidia-h200/engine/gpu_tests.log)
        pytest.param(dict(block_size=16, num_blocks=256, max_num_seqs=4), id="block16-default-budget"),
    ],
)
def test_captured_split_kv_decodes_give_hf_greedy_tokens_over_a_long_prompt(shared_engine, config):
    """A 700-token prompt outgrows the short decode-graph width, so its decodes replay the full-width graph,
    whose kernel splits each context (batch 1)."""
    from servelab.kernels.split_kv import decode_splits
    from servelab.kernels.triton_decode import sm_count

    hf, engine = shared_engine("tiny-llama-hd80", **config)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, hf.config.vocab_size, (700,), generator=g).tolist()]
    assert engine.num_graphs > 0
    widths, bs = engine.runner.graphs.block_widths, engine.config.block_size
    assert widths[0] * bs < len(prompts[0]) <= widths[-1] * bs, widths  # the decodes need the full width...
    assert decode_splits(1, hf.config.num_key_value_heads, widths[-1] * bs, sm_count("cuda")) > 1  # ...which splits
    before = step_counts(engine)
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts, STEPS)
    assert ran_since(engine, before)["graph_steps"] > 0


@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float32), (80, torch.float32), (64, torch.bfloat16)])
def test_compiled_split_ragged_tiles_match_the_reference_at_long_contexts(head_dim, dtype):
    """One mixed step: a decode over 16K keys, short decodes, a chunk after 4K cached keys, a 300-token prompt (long
    tiles); the long tiles split as this GPU's SM count says, and the merge is exact, call after call. The plan
    itself is checked on a CPU at the H100's and H200's 132 SMs (test_ragged_split: the 16K decode splits 6 ways)."""
    from test_ragged_split import LONG_CONTEXT_RUNS, split_case

    from servelab.kernels.ragged import SPLIT, SPLITS, ragged_reference, split_budget
    from servelab.kernels.triton_decode import sm_count
    from servelab.kernels.triton_ragged import triton_ragged

    heads, kv_heads, bs = 14, 2, 16
    sms = sm_count("cuda")
    budget = split_budget(kv_heads, 16384, sms)
    q, kp, vp, rt, cols = split_case(
        heads, kv_heads, head_dim, bs, LONG_CONTEXT_RUNS, budget=budget, dtype=dtype, long_tile_tokens=128, sms=sms
    )
    assert cols[0][:4] == (0, 0, 1, 16383) and cols[0][SPLITS] > 1, cols  # the 16K decode really splits
    assert sum(c[SPLIT] == 0 for c in cols) > 2, cols  # and so do other tiles, merged beside it
    ref = ragged_reference(q.float(), kp.float(), vp.float(), rt, head_dim**-0.5)
    rt.tiles, rt.block_tables, rt.long_tiles, rt.split_tiles = (
        x.cuda() for x in (rt.tiles, rt.block_tables, rt.long_tiles, rt.split_tiles)
    )
    rt.split_counters = torch.zeros(budget * kv_heads, dtype=torch.int32, device="cuda")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for _ in range(3):  # the merging programs reset the shared counters: every call is exact
        got = triton_ragged(q.cuda(), kp.cuda(), vp.cuda(), rt, head_dim**-0.5).float().cpu()
        torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    assert (rt.split_counters == 0).all()


@pytest.mark.gpu_quick
def test_captured_mixed_steps_with_a_long_context_split_and_give_hf_greedy_tokens(monkeypatch):
    """A 1,100-token prompt prefilled in 512-token chunks beside short requests, its last chunk beside a 450-token
    prompt's first 411 tokens, then decoded while that prompt's last 39 are prefilled, in captured whole-step graphs.
    Its last chunk, 76 tokens after 1,024 cached keys, is short enough for packed tiles (a run of 128+ tokens takes
    long tiles, which never split), so its tiles split; so do its first decode's, which sits in a mixed step (a
    decode-only step replays the decode graphs, which the whole-step planner never sees).

    The lengths are checked by replaying the scheduler and the tile planner on a CPU (test_split_plan_replay.py),
    which also reproduces what the H100 showed for the earlier lengths: at (1500, 6, 19, 33, 45) every chunk was
    476-512 tokens, so no chunk split (the H200 failed 2 of 2 so); at (1100, 6, 19, 33, 45) every prompt finished
    in one step and the long prompt decoded in decode-only steps, so no decode split in a mixed step."""
    import servelab.engine.step_graphs as sg

    hf = load_model("config:tiny-llama", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in SPLIT_PROMPTS]
    engine = Engine.from_hf(hf, EngineConfig(**SPLIT_CONFIG, ragged_split_kv=True))
    assert engine.step_graphs_status.startswith("on"), engine.step_graphs_status
    assert engine.runner.step_graphs.split_columns > 1
    planned, plan = [], sg.plan_splits
    monkeypatch.setattr(sg, "plan_splits", lambda *a, **k: planned.append(plan(*a, **k)) or planned[-1])
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts, STEPS)
    cols = [c for _, step in planned for c in step]
    assert any(c[2] > 1 for c in cols) and any(c[2] == 1 for c in cols), planned  # chunks and decodes split
    st = engine.stats()
    assert st["step_graph_steps"] > 0 and st["eager_steps"] == 0, st
    assert (engine.runner.step_graphs.split_counters == 0).all()
