"""Programmatic dependent launch's switch (``kernels/pdl.py``, ``EngineConfig.pdl``): which launches take it.

A CPU has no such launch: by default it is off there, asked for by name it is refused with a clear error before
anything launches, and an engine's "auto" resolves to off. A launch that names no ``pdl`` takes its context's choice,
which ``bind`` sets around every forward of a model, and only there: the same process's other calls keep theirs.
The launch option appears only where it is on, so a Triton build without it sees nothing new. The GPU side (the
same bits with it on, inside a CUDA graph) is ``test_small_linear``'s GPU test, and the engine's exactness on
the GPU runs with it on, its default there.
"""

import copy

import pytest
import torch

from servelab.errors import ParameterError
from servelab.kernels import pdl


def test_a_cpu_never_takes_it_even_inside_a_context_that_asks():
    assert pdl.supported("cpu") is False
    with pdl.launches(True):
        assert pdl.wanted("cpu", None) is False
    assert pdl.wanted("cpu", False) is False


def test_asked_for_by_name_where_there_is_none_it_is_refused():
    with pytest.raises(ParameterError, match="compute capability 9.0"):
        pdl.wanted("cpu", True)


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_only_a_bool_or_none_is_taken(bad):
    with pytest.raises(ParameterError, match="pdl must be True or False"):
        pdl.wanted("cpu", bad)


def test_a_launch_takes_its_context_where_the_device_has_it(monkeypatch):
    monkeypatch.setattr(pdl, "supported", lambda device: True)  # as on a Hopper GPU
    assert pdl.wanted("cuda", None) is False  # outside any context: off
    with pdl.launches(True):
        assert pdl.wanted("cuda", None) is True
        assert pdl.wanted("cuda", False) is False  # a call's own choice wins
        with pdl.launches(False):
            assert pdl.wanted("cuda", None) is False
        assert pdl.wanted("cuda", None) is True
    assert pdl.wanted("cuda", None) is False


def test_a_bound_model_launches_inside_its_setting_and_binding_again_replaces_it(monkeypatch):
    monkeypatch.setattr(pdl, "supported", lambda device: True)
    seen = []

    class Model(torch.nn.Module):
        def forward(self, x):
            seen.append(pdl.wanted("cuda", None))
            return x + 1

    model = Model()
    pdl.bind(model, True)
    assert model(torch.zeros(1)).item() == 1 and seen == [True]
    assert pdl.wanted("cuda", None) is False  # only inside the forward
    pdl.bind(model, False)
    model(torch.zeros(1))
    assert seen == [True, False]
    pdl.bind(model, True)
    model(torch.zeros(1))
    assert seen == [True, False, True]  # one wrapper, not three: the last setting holds
    twin = copy.deepcopy(model)
    pdl.bind(model, False)
    twin(torch.zeros(1))
    assert seen == [True, False, True, True]  # the copy keeps its own setting and calls its own forward
    assert twin.forward.__self__ is twin and twin._pdl_inner_forward.__self__ is twin


def test_the_launch_option_appears_only_when_on():
    assert pdl.launch_kw(True) == {"launch_pdl": True}
    assert pdl.launch_kw(False) == {}


def test_the_engine_resolves_it_on_a_cpu():
    from servelab.engine import Engine, EngineConfig
    from servelab.models import load_model

    with pytest.raises(ParameterError, match="pdl must be True, False or 'auto'"):
        EngineConfig(pdl="yes")
    hf = load_model("config:tiny-llama", dtype="float32", device="cpu", load_tokenizer=False).model
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16))
    assert EngineConfig().pdl == "auto" and engine.stats()["pdl"] is False  # auto: off where it cannot run
    with pytest.raises(ParameterError, match="pdl needs a CUDA GPU"):
        Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16, pdl=True))
    from servelab.engine import SamplingParams

    ids = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, ignore_eos=True))  # the bound forward runs
    assert len(ids[0]) == 3
