"""The engine's request API: streaming, stop conditions, seeds, validation, KV sizing."""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, FinishReason, SamplingParams
from servelab.engine.engine import CPU_DEFAULT_BLOCKS
from servelab.errors import ParameterError
from servelab.models import load_model


@pytest.fixture(scope="module")
def hf():
    return load_model("config:tiny-qwen2").model


@pytest.fixture()
def engine(hf):
    return Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, max_model_len=128))


PROMPT = [5, 9, 33, 100, 7, 250]


def test_stream_yields_each_token_as_it_is_produced(engine):
    a = engine.add_request(PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
    b = engine.add_request(PROMPT[:3], SamplingParams(max_tokens=3, ignore_eos=True))
    events = list(engine.stream())
    assert [e.token_id for e in events if e.seq_id == a.seq_id] == a.output_token_ids and len(a.output_token_ids) == 5
    assert [e.finished for e in events if e.seq_id == b.seq_id] == [False, False, True]
    assert events[-1].finish_reason is FinishReason.LENGTH


def test_stop_token_and_eos_end_a_request(engine):
    free_run = engine.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    stop = free_run[2]
    first = free_run.index(stop) + 1
    assert engine.generate([PROMPT], SamplingParams(max_tokens=6, stop_token_ids=(stop,)))[0] == free_run[:first]
    eos_engine = Engine(engine.model, EngineConfig(block_size=4, num_blocks=64), eos_token_ids=[stop])
    seq = eos_engine.add_request(PROMPT, SamplingParams(max_tokens=6))
    list(eos_engine.stream())
    assert seq.output_token_ids == free_run[:first] and seq.finish_reason is FinishReason.EOS
    ignoring = eos_engine.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert ignoring == free_run


def test_seeded_sampling_is_reproducible_and_seed_dependent(engine):
    def run(seed, neighbours=0):
        others = [SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)] * neighbours
        outs = engine.generate(
            [PROMPT] + [PROMPT[:4]] * neighbours,
            [SamplingParams(max_tokens=8, temperature=1.0, seed=seed, ignore_eos=True)] + others,
        )
        return outs[0]

    assert run(1) == run(1) == run(1, neighbours=2)
    assert run(1) != run(2)


def test_requests_are_validated(engine):
    with pytest.raises(ParameterError, match="max_model_len"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=200))
    with pytest.raises(ParameterError, match="vocab"):
        engine.add_request([1, 10_000])
    with pytest.raises(ParameterError, match="at least one token"):
        engine.add_request([])
    with pytest.raises(ParameterError, match="SamplingParams"):
        engine.generate([PROMPT, PROMPT], [SamplingParams()])


def test_engine_config_is_validated(hf):
    with pytest.raises(ParameterError):
        EngineConfig(block_size=0)
    with pytest.raises(ParameterError):
        EngineConfig(memory_fraction=1.5)
    with pytest.raises(ParameterError):
        EngineConfig(attention_backend="flash")
    with pytest.raises(ParameterError):
        EngineConfig(max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ParameterError):
        EngineConfig(max_num_seqs=4, graph_batch_sizes=(8,))
    with pytest.raises(ParameterError, match="exceeds"):
        Engine.from_hf(hf, EngineConfig(max_model_len=10**6))


def test_kv_pool_size_is_reported(hf):
    engine = Engine.from_hf(hf, EngineConfig(block_size=8, max_model_len=256))
    assert engine.num_blocks == CPU_DEFAULT_BLOCKS == engine.block_manager.num_blocks
    assert engine.pool.num_blocks == CPU_DEFAULT_BLOCKS + 1  # + the scratch block graphs pad into
    assert engine.stats()["num_blocks"] == CPU_DEFAULT_BLOCKS


def test_from_spec_builds_an_engine_from_the_loader():
    engine = Engine.from_spec(
        "config:tiny-gpt2", dtype="float32", device="cpu", config=EngineConfig(block_size=4, num_blocks=32)
    )
    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0]) == 4 and engine.model.family == "gpt2"


def test_varlen_prefill_plumbing(monkeypatch, hf):
    """Where varlen attention exists (CUDA), context-free prefills go through it in one call per layer; here
    an exact CPU stand-in checks that the engine hands it the right packed segments."""
    import servelab.kernels.attention as attention
    from servelab.kernels.prefill import PrefillSegment, prefill_attention

    calls = []

    def fake_varlen(q, k, v, cu, max_len, scale):
        calls.append(cu.tolist())
        out = torch.empty_like(q)
        for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:], strict=True):
            out[a:b] = prefill_attention(q[a:b], k[a:b], v[a:b], PrefillSegment(a, b - a, 0, None), None, None, scale)
        return out

    monkeypatch.setattr(attention, "varlen_prefill", fake_varlen)
    prompts = [PROMPT, PROMPT[:2], PROMPT * 3]
    plain = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64)).generate(
        prompts, SamplingParams(max_tokens=3)
    )
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64))
    engine.runner.varlen = True
    assert engine.generate(prompts, SamplingParams(max_tokens=3)) == plain
    assert calls[0] == [0, 6, 8, 26]


def test_compile_falls_back_to_eager_when_it_fails_or_disagrees(hf, monkeypatch):
    from servelab.models import llama

    def broken(self, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(llama.LlamaModel, "compile_blocks", broken)
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=32, compile=True))
    assert engine.compile_status.startswith("off: compile failed: RuntimeError")

    def wrong(self, **kw):
        pre, post = llama.attention_inputs, llama.attention_outputs
        self.block_fns = (pre, lambda *a: tuple(x * 2 for x in post(*a)))

    monkeypatch.setattr(llama.LlamaModel, "compile_blocks", wrong)
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=32, compile=True))
    assert engine.compile_status.startswith("off: the compiled first 2 blocks' logits differ")
    assert engine.model.block_fns == (llama.attention_inputs, llama.attention_outputs)


@pytest.mark.skipif(
    not __import__("os").environ.get("SERVELAB_SLOW_TESTS"),
    reason="torch.compile on a CPU takes about a minute; set SERVELAB_SLOW_TESTS=1",
)
def test_compiled_blocks_give_the_same_greedy_tokens(hf):
    prompts = [PROMPT, PROMPT[:2], PROMPT * 3]
    plain = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64)).generate(
        prompts, SamplingParams(max_tokens=5)
    )
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, compile=True))
    assert engine.compile_status.startswith("on")
    assert engine.generate(prompts, SamplingParams(max_tokens=5)) == plain


def test_kv_plan_fills_the_memory_fraction_and_refuses_when_one_request_does_not_fit():
    from servelab.engine.memory import plan_kv_blocks

    gib = 2**30
    common = dict(
        total=100 * gib,
        free=90 * gib,
        weights=2 * gib,
        activation_peak=3 * gib,
        decode_extra=gib,
        reserve=gib,
        bytes_per_block=gib // 1024,
        max_blocks_per_seq=128,
    )
    plan = plan_kv_blocks(fraction=0.5, max_num_seqs=10**6, **common)
    assert plan.num_blocks == (50 - 2 - 3 - 1 - 1) * 1024 and not plan.capped
    capped = plan_kv_blocks(fraction=0.5, max_num_seqs=4, **common)
    assert capped.num_blocks == 4 * 128 and capped.capped  # no more than max_num_seqs full-length requests
    tight = plan_kv_blocks(fraction=0.9, max_num_seqs=10**6, **{**common, "free": 20 * gib})
    assert tight.num_blocks == (20 - 3 - 1 - 1) * 1024  # what is free now bounds the budget
    with pytest.raises(MemoryError, match="one request"):
        plan_kv_blocks(fraction=0.0705, max_num_seqs=8, **common)  # 0.05 GiB left


def test_multi_step_decoding_stops_mid_group_and_keeps_seeded_sampling(hf):
    free_run = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64)).generate(
        [PROMPT], SamplingParams(max_tokens=12, ignore_eos=True)
    )[0]
    stop = free_run[5]
    params = [
        SamplingParams(max_tokens=12, stop_token_ids=(stop,)),
        SamplingParams(max_tokens=12, temperature=1.0, seed=4, ignore_eos=True),
    ]
    one = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64)).generate([PROMPT, PROMPT[:3]], params)
    multi = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, decode_steps=8))
    assert multi.generate([PROMPT, PROMPT[:3]], params) == one
    assert one[0] == free_run[: free_run.index(stop) + 1]
    assert multi.runner.decode_groups > 0 and multi.block_manager.num_used_blocks == 0
    assert not multi.runner.tables.row_of and not multi.leaked()  # rows of requests that ended mid-group given back


def test_abort_frees_blocks_and_leaves_the_others_untouched(engine):
    alone = engine.generate([PROMPT[:3]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    gone = engine.add_request(PROMPT * 3, SamplingParams(max_tokens=20, ignore_eos=True))
    kept = engine.add_request(PROMPT[:3], SamplingParams(max_tokens=8, ignore_eos=True))
    queued = engine.add_request(PROMPT, SamplingParams(max_tokens=4))
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert engine.abort(gone) and engine.abort(queued) and not engine.abort(gone)
    assert gone.finish_reason is FinishReason.ABORT and queued.finish_reason is FinishReason.ABORT
    list(engine.stream())
    assert kept.output_token_ids == alone
    assert engine.block_manager.num_used_blocks == 0


def test_on_step_records_the_batch_composition(engine):
    records = []
    engine.on_step = records.append
    engine.generate([PROMPT, PROMPT[:2]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert records[0].prefill_tokens == len(PROMPT) + 2 and records[0].decode_tokens == 0
    assert [r.decode_tokens for r in records[1:]] == [2, 2]
    assert records[0].prefill_context_tokens == 0  # fresh prompts: nothing cached before them
    assert records[1].decode_context_tokens == (len(PROMPT) + 1) + (2 + 1)  # each decode attends to all its tokens
    assert all(r.end_s >= r.start_s for r in records)


def test_the_engine_swaps_its_policy_only_when_idle_and_reports_its_kv_blocks(hf):
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=32))
    assert engine.kv_blocks() == (0, 32)
    seq = engine.add_request(PROMPT, SamplingParams(max_tokens=3))
    engine.step()
    used, total = engine.kv_blocks()
    assert total == 32 and used == engine.block_manager.num_used_blocks > 0
    with pytest.raises(RuntimeError, match="not idle"):
        engine.set_policy("fcfs", 512)
    while engine.has_unfinished():
        engine.step()
    assert seq.finish_reason is not None and engine.kv_blocks() == (0, 32)
    engine.set_policy("fcfs", 512)
    assert type(engine.scheduler).__name__ == "FCFS" and engine.scheduler.max_num_batched_tokens == 512
    assert (engine.config.scheduler, engine.config.max_num_batched_tokens) == ("fcfs", 512)
    with pytest.raises(ParameterError):
        engine.set_policy("no-such-policy")
    assert engine.config.scheduler == "fcfs"  # a refused swap changes nothing
