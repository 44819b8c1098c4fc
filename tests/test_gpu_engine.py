"""The engine's captured paths on a CUDA device (skipped without one; run on the H200 by the GPU scripts).

In float32 the engine with decode graphs and whole-step graphs (ragged Triton attention) must give HF's
greedy tokens, under chunked prefill and with the prefix cache, as the CPU tests require of the eager path;
also at head_dim 80 (padded inside the kernels), and with split-KV decode over a long context, in the decode
kernel and in the ragged kernel of a captured mixed step.
"""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.models import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

STEPS = 10
GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)


def hf_greedy(hf, prompts):
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                pad_token_id=0,
            )
            refs.append(out[0, len(p) :].tolist())
    return refs


@pytest.mark.parametrize("family", ["tiny-qwen2", "tiny-llama", "tiny-gpt2", "tiny-llama-hd80"])
@pytest.mark.parametrize(
    "policy,budget", [("chunked_prefill", 64), ("chunked_prefill", 160), ("eager_cont_batch", 512)]
)
def test_captured_steps_give_hf_greedy_tokens_in_float32(family, policy, budget):
    """Budgets of 160 and 512 put runs of 128 tokens or more (long tiles) in the steps, after cached context too."""
    hf = load_model(f"config:{family}", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (6, 19, 33, 2, 45, 300)]
    engine = Engine.from_hf(
        hf, EngineConfig(block_size=4, num_blocks=512, max_num_seqs=4, max_num_batched_tokens=budget, scheduler=policy)
    )
    assert engine.step_graphs_status.startswith("on"), engine.step_graphs_status
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts)
    st = engine.stats()
    assert st["step_graph_steps"] > 0 and st["eager_steps"] == 0, st


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


@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float32), (80, torch.float32), (128, torch.bfloat16)])
def test_compiled_split_kv_decode_matches_gather_at_long_contexts(head_dim, dtype):
    from servelab.kernels.decode import gather_decode
    from servelab.kernels.split_kv import decode_splits
    from servelab.kernels.triton_decode import sm_count, triton_decode

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


def test_captured_split_kv_decodes_give_hf_greedy_tokens_over_a_long_prompt():
    """A 700-token prompt outgrows the short decode-graph width, so its decodes replay the full-width graph,
    whose kernel splits each context (batch 1)."""
    hf = load_model("config:tiny-llama-hd80", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, hf.config.vocab_size, (700,), generator=g).tolist()]
    engine = Engine.from_hf(hf, EngineConfig(block_size=16, num_blocks=256, max_num_seqs=4))
    assert engine.num_graphs > 0
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts)


@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float32), (80, torch.float32), (64, torch.bfloat16)])
def test_compiled_split_ragged_tiles_match_the_reference_at_long_contexts(head_dim, dtype):
    """One mixed step: a decode over 16K keys, short decodes, a chunk after 4K cached keys, a 300-token prompt (long
    tiles); the long tiles split as the H200's SM count says, and the merge is exact, call after call."""
    from test_ragged_split import split_case

    from servelab.kernels.ragged import SPLITS, ragged_reference, split_budget
    from servelab.kernels.triton_decode import sm_count
    from servelab.kernels.triton_ragged import triton_ragged

    heads, kv_heads, bs = 14, 2, 16
    runs = [(1, 16383), (1, 100), (1, 5000), (40, 4000), (300, 0), (1, 700)]
    sms = sm_count("cuda")
    budget = split_budget(kv_heads, 16384, sms)
    q, kp, vp, rt, cols = split_case(
        heads, kv_heads, head_dim, bs, runs, budget=budget, dtype=dtype, long_tile_tokens=128, sms=sms
    )
    assert max(c[SPLITS] for c in cols) > 8, cols  # the 16K decode really splits
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


def test_captured_mixed_steps_with_a_long_context_split_and_give_hf_greedy_tokens(monkeypatch):
    """A 1,500-token prompt prefilled beside short requests, then decoded while a fifth request's prompt is
    prefilled: its chunks after 512+ cached keys and its decode inside a mixed step run as split tiles, in captured
    whole-step graphs."""
    import servelab.engine.step_graphs as sg

    hf = load_model("config:tiny-llama", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (1500, 6, 19, 33, 45)]
    engine = Engine.from_hf(
        hf,
        EngineConfig(
            block_size=16,
            num_blocks=512,
            max_num_seqs=4,
            max_num_batched_tokens=512,
            scheduler="chunked_prefill",
            ragged_split_kv=True,
        ),
    )
    assert engine.step_graphs_status.startswith("on"), engine.step_graphs_status
    assert engine.runner.step_graphs.split_columns > 1
    planned, plan = [], sg.plan_splits
    monkeypatch.setattr(sg, "plan_splits", lambda *a, **k: planned.append(plan(*a, **k)) or planned[-1])
    assert engine.generate(prompts, GREEDY) == hf_greedy(hf, prompts)
    cols = [c for _, step in planned for c in step]
    assert any(c[2] > 1 for c in cols) and any(c[2] == 1 for c in cols), planned  # chunks and decodes split
    st = engine.stats()
    assert st["step_graph_steps"] > 0 and st["eager_steps"] == 0, st
    assert (engine.runner.step_graphs.split_counters == 0).all()
