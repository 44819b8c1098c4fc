"""``server.heap.freeze_heap``: a built engine's objects leave the collector's view; objects made after are still
collected; the engine process reports what it froze."""

import gc

import pytest

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.server.heap import freeze_heap


@pytest.fixture()
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_a_built_engine_is_frozen_and_later_garbage_is_still_collected(unfrozen):
    engine = Engine.from_spec("config:tiny-llama", dtype="float32", device="cpu", config=EngineConfig(num_blocks=16))
    tracked = len(gc.get_objects())
    frozen = freeze_heap()
    assert frozen == gc.get_freeze_count() >= tracked // 2  # the engine's objects, not a handful
    assert len(gc.get_objects()) < tracked // 10  # a full collection now walks almost nothing
    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert [len(t) for t in out] == [2]  # the frozen engine still runs
    before = len(gc.get_objects())
    for _ in range(1000):
        Node()
    gc.collect()
    assert len(gc.get_objects()) < before + 100  # new cycles are collected as before
