"""A Llama/Qwen2 model's decode blocks through ``kernels.small_linear`` (``models/small_batch.py``, issue 29).

Under Triton's interpreter (a child process), an engine built on a model switched by ``use_small_linear`` gives HF's
greedy tokens in float32 (Qwen2's shape: q/k/v biases), with its decode steps on the small path and its prefill
steps on the model's own block functions, and again with RoPE and the pool write in the qkv launch
(``rope_in_qkv``); the switch survives the engine's construction and a later ``compile_blocks``. Bad settings are
refused.
"""

import textwrap

import pytest
from interpreted import run_interpreted

from servelab.errors import ParameterError

pytest.importorskip("triton")

CHECK = textwrap.dedent(
    """
    import tests.test_engine_head_sizes as heads_test
    from servelab.engine import Engine, EngineConfig
    from servelab.kernels.small_linear import MAX_ROWS
    from servelab.models import small_batch
    from servelab.models.native import native_from_hf

    rows = []
    real = small_batch.norm_linear
    small_batch.norm_linear = lambda h, *a, **kw: rows.append(h.shape[0]) or real(h, *a, **kw)
    for name in ("tiny-qwen2",):  # q/k/v biases: the wider of the two paths (Llama is the same without)
        hf, prompts, refs = heads_test.hf_case(name)
        model = native_from_hf(hf, max_positions=256)
        # every width the kernel takes, not just the default; six launches a layer (RoPE in a launch of its own)
        small_batch.use_small_linear(model, max_rows=MAX_ROWS, rope_in_qkv=False)
        engine = Engine(model, EngineConfig(block_size=4, num_blocks=64, max_model_len=256, fused_rope_kv_write=True))
        assert small_batch.uses_small_linear(engine.model), name
        rows.clear()
        assert engine.generate(prompts, heads_test.GREEDY) == refs, name
        layers = hf.config.num_hidden_layers
        assert rows and max(rows) <= MAX_ROWS and len(rows) % (2 * layers) == 0, (name, rows)
        small_steps = len(rows) // (2 * layers)  # two norm_linear calls a layer
        assert 0 < small_steps < engine.steps, (name, small_steps, engine.steps)  # decodes small, prefills not

    # RoPE and the pool write in the qkv launch (rope_in_qkv): the same tokens, with the small rows' qkv launches
    # through norm_linear_rope_kv and none through norm_linear's plain qkv
    fused = []
    real_rope = small_batch.norm_linear_rope_kv
    small_batch.norm_linear_rope_kv = lambda h, *a, **kw: fused.append(h.shape[0]) or real_rope(h, *a, **kw)
    model = native_from_hf(hf, max_positions=256)
    small_batch.use_small_linear(model, max_rows=MAX_ROWS, rope_in_qkv=True)
    engine = Engine(model, EngineConfig(block_size=4, num_blocks=64, max_model_len=256, fused_rope_kv_write=True))
    rows.clear()
    assert engine.generate(prompts, heads_test.GREEDY) == refs, "rope_in_qkv"
    assert fused and max(fused) <= MAX_ROWS and len(fused) % layers == 0, fused
    assert len(rows) == len(fused), (rows, fused)  # one norm_linear a layer left: the gate_up one

    # the engine's own switch (EngineConfig.small_batch, "auto": on with the fused RoPE + KV write): one-row steps
    # small (max_rows 1), the same tokens; small_batch=False keeps the model's own blocks
    rows.clear()
    fused.clear()
    engine = Engine(native_from_hf(hf, max_positions=256),
                    EngineConfig(block_size=4, num_blocks=64, max_model_len=256, fused_rope_kv_write=True))
    assert small_batch.uses_small_linear(engine.model) and engine.stats()["small_batch"] is True
    assert engine.generate(prompts, heads_test.GREEDY) == refs, "engine switch"
    assert engine.generate(prompts[:1], heads_test.GREEDY) == refs[:1], "engine switch, one row"
    assert fused and set(fused) == {1}, fused  # the rope_in_qkv launch, at one row only (a lone decode)
    fused.clear()
    engine = Engine(native_from_hf(hf, max_positions=256), EngineConfig(
        block_size=4, num_blocks=64, max_model_len=256, fused_rope_kv_write=True, small_batch=False))
    assert not small_batch.uses_small_linear(engine.model) and engine.stats()["small_batch"] is False
    assert engine.generate(prompts, heads_test.GREEDY) == refs and not fused, "small_batch=False"

    # the switch survives a later compile (wrapped lazily: nothing compiles until a call) and the engine setting
    # the value it holds; another value drops it, and uses_small_linear says so
    from servelab.models import llama
    model = native_from_hf(hf, max_positions=64)
    small_batch.use_small_linear(model)
    model.compile_blocks()
    assert small_batch.uses_small_linear(model)
    model.set_fused_rope_kv_write(True)
    assert small_batch.uses_small_linear(model)
    model.set_fused_rope_kv_write(False)
    assert not small_batch.uses_small_linear(model)
    assert model.block_fns == (llama.attention_inputs, llama.attention_outputs)
    print("ok")
    """
)


def test_small_linear_blocks_give_hf_greedy_tokens_under_the_interpreter():
    run_interpreted(CHECK)


def test_the_engine_refuses_small_batch_where_it_cannot_run_and_leaves_it_off_by_itself():
    from servelab.engine import Engine, EngineConfig
    from servelab.engine.tensor_parallel import TPLlamaModel
    from servelab.models import load_model
    from servelab.models.small_batch import runs_on

    with pytest.raises(ParameterError, match="small_batch"):
        EngineConfig(small_batch="yes")
    hf = load_model("config:tiny-llama").model
    auto = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16))  # a CPU: no fused path, so no small blocks
    assert auto.stats()["small_batch"] is False and auto.stats()["fused_rope_kv_write"] is False
    with pytest.raises(ParameterError, match="small_batch needs fused_rope_kv_write"):
        Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16, fused_rope_kv_write=False, small_batch=True))
    assert runs_on(auto.model) and not runs_on(load_model("config:tiny-gpt2").model)
    assert TPLlamaModel.sharded  # a shard's blocks all-reduce; the fused small blocks would not


def _tiny(name="tiny-llama"):
    from servelab.models.loader import load_model
    from servelab.models.native import native_from_hf

    hf = load_model(f"config:{name}", dtype="float32", device="cpu", load_tokenizer=False).model
    return native_from_hf(hf, max_positions=64)


def test_bad_settings_are_refused():
    from servelab.models.small_batch import small_batch_fns, use_small_linear

    with pytest.raises(ParameterError, match="max_rows must be 1 to 8"):
        small_batch_fns(None, None, max_rows=0)
    with pytest.raises(ParameterError, match="no fused RoPE"):
        use_small_linear(_tiny("tiny-gpt2"))


def test_by_default_only_one_row_takes_the_small_path(monkeypatch):
    """PAYS_UP_TO: past one row cuBLAS's GEMM was faster on the GPU, so a two-row step goes to the model's own
    blocks and a one-row step to small_linear's."""
    import torch

    from servelab.models import small_batch

    calls = []
    for name in ("norm_linear", "linear", "silu_mul_linear"):
        monkeypatch.setattr(small_batch, name, lambda h, *a, _n=name, **kw: calls.append(_n) or (h, h))
    pre = lambda h, *a: calls.append("pre")  # noqa: E731
    post = lambda h, *a: calls.append("post")  # noqa: E731
    small_pre, small_post = small_batch.small_batch_fns(pre, post)
    for rows in (2, 1):
        small_pre(torch.zeros(rows, 4), None, None, 0.0, None, None)
        small_post(torch.zeros(rows, 4), torch.zeros(rows, 4), None, None, 0.0, None, None)
    assert small_batch.PAYS_UP_TO == 1
    assert calls == ["pre", "post", "norm_linear", "linear", "norm_linear", "silu_mul_linear"]
