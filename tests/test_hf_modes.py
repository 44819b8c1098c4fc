import torch

from servelab.bench.hf_modes.cuda_graph import static_step
from servelab.bench.hf_modes.eager import eager_step
from servelab.models import load_model


def test_eager_step_resets_the_cache_to_its_context():
    """The same input ids each step: the logits change only with the cache under them, so they say which it is."""
    m = load_model("config:tiny-qwen2").model
    fn, reset = eager_step(m, batch=2, new_tokens=1, context=16)
    first = fn()
    assert first.shape == (2, 1, m.config.vocab_size)
    assert not torch.equal(fn(), first)  # the cache grows by one token per step ...
    reset()
    assert torch.equal(fn(), first)  # ... and reset() puts it back, so repeated timed steps see the same context


def test_static_step_writes_at_the_context_slot_every_time():
    """Repeated steps must keep writing slot `context` (transformers 5.x advances an internal counter)."""
    m = load_model("config:tiny-llama").model
    step, rewind, cache = static_step(m, batch=1, new_tokens=1, context=8)
    step()
    step.fill_context()
    before = cache.layers[0].keys.clone()
    for _ in range(5):  # without rewind() the 2nd step would write past the 9-slot cache
        rewind()
        step()
    after = cache.layers[0].keys
    changed = (after != before).any(dim=-1).any(dim=1)[0]  # per slot
    assert changed.nonzero().flatten().tolist() == [8]


def test_static_step_prefill_stays_in_bounds():
    m = load_model("config:tiny-qwen2").model
    step, rewind, cache = static_step(m, batch=2, new_tokens=16, context=0)
    for _ in range(3):
        rewind()
        assert torch.isfinite(step()).all()


def test_hf_modes_prefill_a_chunk_after_random_context():
    """A chunk after cached context: eager appends to a DynamicCache of `context` random tokens; the static cache
    (the CUDA-graph mode's) writes exactly the chunk's slots, every time."""
    m = load_model("config:tiny-llama").model
    fn, reset = eager_step(m, batch=2, new_tokens=8, context=24)
    assert fn().shape == (2, 1, m.config.vocab_size)
    reset()
    assert torch.isfinite(fn()).all()
    step, rewind, cache = static_step(m, batch=1, new_tokens=8, context=24)
    step()
    step.fill_context()
    before = cache.layers[0].keys.clone()
    for _ in range(3):
        rewind()
        assert torch.isfinite(step()).all()
    changed = (cache.layers[0].keys != before).any(dim=-1).any(dim=1)[0]
    assert changed.nonzero().flatten().tolist() == list(range(24, 32))


def test_only_the_engine_modes_run_mixed_steps():
    from servelab.bench.hf_modes import MIXED_MODES, MODES

    assert set(MIXED_MODES) == {"engine", "engine_eager"} and set(MIXED_MODES) < set(MODES)
