"""One engine step as a timed callable, with the contract of ``servelab.hf_modes``:

    fn, before_each = engine_step(hf_model, batch, new_tokens, context)

``batch`` sequences each hold ``context`` cached tokens (random prompt ids, prefilled by the engine)
and compute ``new_tokens`` more: a decode step is ``new_tokens=1`` (a CUDA-graph replay on a GPU,
input copies included); a prefill is ``context=0``. ``fn()`` runs the model forward of that step and
returns its logits; scheduling and sampling are not in it (``Engine.step`` times those). Repeated
calls write the same slots, so every call does the same work.
"""

from __future__ import annotations

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine
from servelab.engine.sequence import SamplingParams
from servelab.profiles import ParameterError


def prepared_step(engine: Engine, batch: int, new_tokens: int, context: int, *, seed: int = 0):
    """Add ``batch`` requests to ``engine``, bring them to ``context`` cached tokens, return the next step's batch."""
    if new_tokens != 1 and context != 0:
        raise ParameterError("engine steps are decode (new_tokens=1) or prefill (context=0); "
                             f"got new_tokens={new_tokens}, context={context}")
    vocab = engine.model.shape.vocab
    g = torch.Generator().manual_seed(seed)
    prompt_len = context if new_tokens == 1 else new_tokens
    if prompt_len < 1:
        raise ParameterError("a decode step needs context >= 1")
    params = SamplingParams(max_tokens=engine.max_model_len - prompt_len, ignore_eos=True)
    seqs = [engine.add_request(torch.randint(0, vocab, (prompt_len,), generator=g).tolist(), params)
            for _ in range(batch)]
    if new_tokens == 1:
        while any(s.num_computed_tokens < context for s in seqs):
            engine.step()  # prefill: each sequence ends with `context` cached tokens and one sampled
    step = engine.scheduler.schedule()
    if len(step.items) != batch or step.num_tokens != batch * new_tokens:
        raise RuntimeError(f"the scheduler did not put the whole step in one batch ({len(step.items)} items, "
                           f"{step.num_tokens} tokens); raise max_num_batched_tokens / max_num_seqs")
    return step


def step_engine_config(batch: int, new_tokens: int, context: int, block_size: int = 16,
                       attention_backend: str = "auto", compile: bool = False) -> EngineConfig:
    """The smallest engine that holds the step: one graph bucket (the batch) for a decode step."""
    total = context + new_tokens + 1
    blocks = batch * -(-total // block_size) + 1
    # the whole preparing prefill runs in one step, so that every sequence reaches `context` together
    return EngineConfig(block_size=block_size, max_num_seqs=batch, max_num_batched_tokens=batch * max(new_tokens,
                        context, 1), max_model_len=total, num_blocks=blocks, graph_batch_sizes=(batch,),
                        cuda_graphs=new_tokens == 1, attention_backend=attention_backend, compile=compile)


def engine_step(model, batch: int, new_tokens: int, context: int, *, seed: int = 0,
                attention_backend: str = "auto", compile: bool = False):
    """``(fn, None)``: ``fn()`` runs the project's engine forward for the step (see the module docstring)."""
    engine = Engine.from_hf(model, step_engine_config(batch, new_tokens, context, attention_backend=attention_backend,
                                                      compile=compile))
    step = prepared_step(engine, batch, new_tokens, context, seed=seed)

    def fn():
        return engine.runner.logits(step)[0]

    fn.engine = engine  # for the caller's records (backend, graphs)
    return fn, None
