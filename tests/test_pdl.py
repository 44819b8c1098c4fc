"""Programmatic dependent launch's switch (``kernels/pdl.py``): which launches take it, and what is refused.

A CPU has no such launch: asked for by default (``ON``) it is quietly off, asked for by name it is refused with
a clear error before anything launches. The launch option appears only where it is on, so a Triton build without it
sees nothing new. The GPU side (the same bits with it on, in a CUDA graph) is ``test_small_linear``'s GPU test.
"""

import pytest

from servelab.errors import ParameterError
from servelab.kernels import pdl


def test_a_cpu_never_takes_it_by_default(monkeypatch):
    monkeypatch.setattr(pdl, "ON", True)
    assert pdl.supported("cpu") is False
    assert pdl.wanted("cpu", None) is False
    assert pdl.wanted("cpu", False) is False


def test_asked_for_by_name_where_there_is_none_it_is_refused():
    with pytest.raises(ParameterError, match="compute capability 9.0"):
        pdl.wanted("cpu", True)


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_only_a_bool_or_none_is_taken(bad):
    with pytest.raises(ParameterError, match="pdl must be True or False"):
        pdl.wanted("cpu", bad)


def test_the_launch_option_appears_only_when_on():
    assert pdl.launch_kw(True) == {"launch_pdl": True}
    assert pdl.launch_kw(False) == {}


def test_it_is_off_by_default_until_measured():
    """The default is the fastest measured configuration (issue 29): PDL stays off until the H200 says it pays."""
    assert pdl.ON is False
