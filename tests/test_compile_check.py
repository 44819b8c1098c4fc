"""``engine.compilation``: the engine's compile check, on the first two blocks alone (issue 29).

A compiler that raises, or a "compiled" block that computes something else, leaves the model eager with the reason
in the status; a faithful one is kept, and the model gets all its layers back either way. The engine's first check,
on the whole model, refused rounding that a deep bf16 model amplifies; on two blocks the same rule
sees rounding at bf16's size (the GPU probe, ``scripts/probe_compile_check.py``, measures both on the 8B shape).
"""

import pytest
import torch
from hf_reference import varied

from servelab.engine import Engine, EngineConfig, compilation
from servelab.engine.compilation import compile_with_check, first_blocks
from servelab.models import llama


@pytest.fixture()
def engine():
    return Engine.from_hf(varied("tiny-llama"), EngineConfig(block_size=4, num_blocks=32))


def check(engine) -> str:
    return compile_with_check(engine.model, engine.pool, engine.num_blocks)


def test_a_faithful_compilation_is_kept_and_every_layer_comes_back(engine, monkeypatch):
    layers = list(engine.model.layers)

    def faithful(self, **kw):  # what torch.compile should give: the same functions, called through a wrapper
        pre, post = llama.attention_inputs, llama.attention_outputs
        self.block_fns = (lambda *a: pre(*a), lambda *a: post(*a))

    monkeypatch.setattr(llama.LlamaModel, "compile_blocks", faithful)
    assert check(engine).startswith("on (first 2 blocks: max |logit diff| vs eager 0")
    assert engine.model.block_fns != (llama.attention_inputs, llama.attention_outputs)
    assert list(engine.model.layers) == layers


def test_a_compiler_that_raises_leaves_the_model_eager(engine, monkeypatch):
    def broken(self, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(llama.LlamaModel, "compile_blocks", broken)
    assert check(engine) == "off: compile failed: RuntimeError: no compiler here"
    assert engine.model.block_fns == (llama.attention_inputs, llama.attention_outputs)
    assert len(engine.model.layers) == 2


@pytest.mark.parametrize("fault", ["whole output x2", "mlp output x1.5"])
def test_a_block_that_computes_something_else_is_refused(engine, monkeypatch, fault):
    """Scaling a block's whole output is invisible through one block (the final RMSNorm undoes it): two see it."""

    def wrong(self, **kw):
        pre, post = llama.attention_inputs, llama.attention_outputs
        if fault == "whole output x2":
            self.block_fns = (pre, lambda *a: tuple(x * 2 for x in post(*a)))
        else:
            self.block_fns = (pre, lambda *a: (post(*a)[0], post(*a)[1] * 1.5))

    monkeypatch.setattr(llama.LlamaModel, "compile_blocks", wrong)
    assert check(engine).startswith("off: the compiled first 2 blocks' logits differ from eager by")
    assert engine.model.block_fns == (llama.attention_inputs, llama.attention_outputs)
    if fault == "whole output x2":  # why two: the first block alone passes it
        monkeypatch.setattr(compilation, "BLOCKS", 1)
        assert check(engine).startswith("on (first 1 blocks")


def test_the_first_blocks_are_the_model_cut_to_them(engine):
    """Inside the block the model is its embedding, its first block(s), final norm and head."""
    model = engine.model
    with first_blocks(model, 1) as cut:
        assert len(cut.layers) == 1 and cut.layers[0] is model.layers[0]
    assert len(model.layers) == 2
    with pytest.raises(ValueError), first_blocks(model):
        raise ValueError("the layers come back on an error too")
    assert len(model.layers) == 2 and isinstance(model.layers, torch.nn.ModuleList)
