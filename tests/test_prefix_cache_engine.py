"""Prefix caching in the engine (float32, CPU, tiny random models): greedy outputs are token-identical with and
without the cache under every scheduling policy, with chunked prompts, full-prompt hits, multi-turn histories,
eviction under pressure and preemption of sequences that share blocks; cached tokens really skip the prefill."""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.models import load_model

POLICIES = ["fcfs", "eager_cont_batch", "chunked_prefill"]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def family(request):
    """Both position schemes: rotary (Llama) and learned absolute positions (GPT-2)."""
    return load_model(f"config:{request.param}").model


@pytest.fixture(scope="module")
def hf():
    return load_model("config:tiny-llama").model


def rand_tokens(hf, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist()


def engine(hf, cache=True, **kw):
    cfg = dict(block_size=4, num_blocks=128)
    cfg.update(kw)
    return Engine.from_hf(hf, EngineConfig(prefix_caching=cache, **cfg))


def reference(hf, prompts, params=GREEDY):
    """Outputs of the engine without a cache, one prompt at a time (HF-exact: tests/test_engine_exactness.py)."""
    e = engine(hf, cache=False)
    return [e.generate([p], params)[0] for p in prompts]


def prefill_tokens(e):
    """Counts the tokens each step computes that are not single-token decodes."""
    counted = []
    e.on_step = lambda r: counted.append(r.prefill_tokens)
    return counted


@pytest.mark.parametrize("policy", POLICIES)
def test_shared_system_prompt_outputs_are_identical_under_every_policy(family, policy):
    hf = family
    system = rand_tokens(hf, 21, 0)
    prompts = [system + rand_tokens(hf, n, 10 + n) for n in (3, 8, 1, 5)]
    ref = reference(hf, prompts)
    e = engine(hf, scheduler=policy)
    assert e.generate(prompts, GREEDY) == ref  # all admitted at once: later ones share blocks computed in-step
    assert e.generate(prompts, GREEDY) == ref  # warm cache
    assert [e.generate([p], GREEDY)[0] for p in prompts] == ref
    st = e.stats()
    assert st["prefix_hit_tokens"] > 0 and 0 < st["prefix_hit_rate"] < 1
    assert e.block_manager.num_used_blocks == 0


def test_cached_tokens_skip_the_prefill(hf):
    prompt = rand_tokens(hf, 30, 1)
    e = engine(hf)
    counted = prefill_tokens(e)
    first = e.generate([prompt], GREEDY)
    assert counted[0] == 30
    counted.clear()
    assert e.generate([prompt], GREEDY) == first
    # a full-prompt hit: 7 full blocks of 4 are cached, but the last token is always computed, so 28 cached
    # tokens would leave 2; the cache gives (30 - 1) // 4 = 7 blocks = 28 tokens
    assert counted[0] == 2
    assert e.stats()["prefix_hit_tokens"] == 28


def test_prompt_of_whole_blocks_recomputes_its_last_block(hf):
    prompt = rand_tokens(hf, 16, 2)
    e = engine(hf)
    counted = prefill_tokens(e)
    first = e.generate([prompt], GREEDY)
    counted.clear()
    assert e.generate([prompt], GREEDY) == first == reference(hf, [prompt]) and counted[0] == 4


def test_chunked_prompts_with_a_cached_prefix(hf):
    system = rand_tokens(hf, 26, 3)
    prompts = [system + rand_tokens(hf, n, 20 + n) for n in (9, 2, 14)]
    ref = reference(hf, prompts)
    e = engine(hf, max_num_seqs=4, max_num_batched_tokens=7)
    assert e.generate(prompts, GREEDY) == ref
    assert e.generate(prompts[::-1], GREEDY) == ref[::-1]
    assert e.stats()["prefix_hit_tokens"] > 0


def test_multi_turn_history_including_generated_tokens_is_reused(family):
    hf = family
    e = engine(hf)
    history = rand_tokens(hf, 10, 4)
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    ref_engine = engine(hf, cache=False)
    prev_len = 0  # the conversation's length after the previous turn's answer
    for turn in range(4):
        hit_before = e.stats()["prefix_hit_tokens"]
        out = e.generate([history], params)[0]
        assert out == ref_engine.generate([history], params)[0]
        if turn:  # everything but the new message was computed before, generated tokens included
            assert e.stats()["prefix_hit_tokens"] - hit_before >= (prev_len // 4) * 4 - 4
        prev_len = len(history) + len(out)
        history = history + out + rand_tokens(hf, 3, 40 + turn)


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_eviction_under_pressure_then_reuse_gives_correct_outputs(hf, eviction):
    prefixes = [rand_tokens(hf, 22, 100 + i) for i in range(8)]
    prompts = [p + rand_tokens(hf, 3, 200 + i) for i, p in enumerate(prefixes)]
    ref = reference(hf, prompts)
    # 12 blocks of 4 tokens hold two requests at a time; eight distinct prefixes evict each other
    e = engine(hf, num_blocks=12, prefix_eviction=eviction)
    assert [e.generate([p], GREEDY)[0] for p in prompts] == ref
    assert e.stats()["prefix_evictions"] > 0
    assert [e.generate([p], GREEDY)[0] for p in prompts[:3]] == ref[:3]  # the first again, after eviction
    assert e.generate(prompts, GREEDY) == ref  # all together, on the tiny pool
    assert e.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_preemption_of_sequences_sharing_blocks_keeps_outputs_exact(family, policy):
    hf = family
    system = rand_tokens(hf, 12, 5)
    prompts = [system + rand_tokens(hf, n, 60 + n) for n in (2, 5, 3, 6)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    ref = reference(hf, prompts, params)
    e = engine(hf, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=32, scheduler=policy)
    assert e.generate(prompts, params) == ref
    assert e.scheduler.num_preemptions > 0
    assert e.stats()["prefix_hit_tokens"] > 0
    assert e.block_manager.num_used_blocks == 0


def test_reset_forgets_every_prefix(hf):
    prompt = rand_tokens(hf, 20, 6)
    e = engine(hf)
    first = e.generate([prompt], GREEDY)
    e.reset_prefix_cache()
    assert e.block_manager.num_cached_blocks == 0 and e.block_manager.match_prefix(prompt) == []
    counted = prefill_tokens(e)
    assert e.generate([prompt], GREEDY) == first and counted[0] == 20


def test_off_by_default_and_reported_in_stats(hf):
    e = engine(hf, cache=False)
    assert e.block_manager.prefix_cache is None
    e.generate([rand_tokens(hf, 12, 7)] * 2, GREEDY)
    st = e.stats()
    assert st["prefix_caching"] is False and e.prefix_hit_rate == 0.0 and "prefix_hit_rate" not in st


def test_caching_can_be_switched_between_runs(hf):
    prompt = rand_tokens(hf, 20, 8)
    e = engine(hf, cache=False)
    first = e.generate([prompt], GREEDY)
    e.set_prefix_caching(True)
    assert e.generate([prompt] * 2, GREEDY) == first * 2 and e.stats()["prefix_hit_tokens"] == 16
    e.set_prefix_caching(False)
    assert e.block_manager.num_free_blocks == e.num_blocks and e.generate([prompt], GREEDY) == first
    e.add_request(prompt, GREEDY)
    with pytest.raises(RuntimeError, match="in flight"):
        e.set_prefix_caching(True)


def test_multi_step_decoding_caches_generated_blocks_too(hf):
    system = rand_tokens(hf, 9, 9)
    prompts = [system + rand_tokens(hf, 4, 90 + i) for i in range(3)]
    params = SamplingParams(max_tokens=11, ignore_eos=True)
    ref = reference(hf, prompts, params)
    e = engine(hf, decode_steps=4)
    assert e.generate(prompts, params) == ref and e.runner.decode_groups > 0
    follow_up = prompts[0] + ref[0] + rand_tokens(hf, 2, 99)  # the next turn reuses the generated blocks
    hit_before = e.stats()["prefix_hit_tokens"]
    assert e.generate([follow_up], params) == reference(hf, [follow_up], params)
    assert e.stats()["prefix_hit_tokens"] - hit_before == (len(prompts[0]) + len(ref[0]) - 1) // 4 * 4


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_a_hit_leaving_one_token_runs_as_a_decode_beside_others(hf, decode_steps):
    prompt = rand_tokens(hf, 17, 10)  # 4 full blocks + 1 token: a hit leaves exactly 1
    other = rand_tokens(hf, 6, 11)
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    ref = reference(hf, [prompt, other], params)
    e = engine(hf, decode_steps=decode_steps)
    assert e.generate([prompt], params) == ref[:1]
    counted = prefill_tokens(e)
    first = e.add_request(other, params)
    e.step()  # other's prefill; it decodes from the next step on
    again = e.add_request(prompt, params)  # joins the running decode as a one-token item
    for _ in e.stream():
        pass
    assert [first.output_token_ids, again.output_token_ids] == [ref[1], ref[0]]
    assert e.stats()["prefix_hit_tokens"] == 16 and counted[0] == 6


@pytest.mark.parametrize("policy", ["eager_cont_batch", "chunked_prefill"])
def test_whole_step_path_with_shared_blocks_and_preemption_keeps_outputs_exact(hf, policy):
    """Cache hits, copy-on-write and preemption through the padded whole-step path (ragged attention over
    each sequence's block table), run uncaptured on the CPU."""
    system = rand_tokens(hf, 12, 5)
    prompts = [system + rand_tokens(hf, n, 60 + n) for n in (2, 5, 3, 6)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    ref = reference(hf, prompts, params)
    e = engine(hf, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=32, scheduler=policy)
    e.runner.enable_step_graphs([8, 16, 32], capture=False)
    assert e.generate(prompts, params) == ref
    assert e.generate(prompts, params) == ref  # warm cache
    assert e.scheduler.num_preemptions > 0 and e.stats()["prefix_hit_tokens"] > 0
    assert e.runner.eager_steps == 0 and e.runner.step_graph_steps == e.steps
