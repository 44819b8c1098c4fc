"""An engine's logits for one sequence outside its serving loop: what the benchmark's exactness check compares with
HF's on the same weights. It schedules the sequence as a step would, reads the logits, and finishes it, so the
scheduler's and the block tables' state stays the engine's business (nothing outside ``engine/`` touches them)."""

from __future__ import annotations

import torch

from servelab.engine.sequence import SamplingParams
from servelab.engine.step_inputs import build_step_inputs


def _finish(engine, batch, tokens) -> None:
    """What ``Engine.step`` does after a step: the scheduler takes the tokens, finished sequences free their rows."""
    for ev in engine.scheduler.postprocess(batch, tokens):
        if ev.finished:
            engine.runner.release(ev.seq_id)


@torch.inference_mode()
def prefill_logits(engine, prompt: list[int]) -> torch.Tensor:
    """The logits for the prompt's last position (its first step), float32 on the CPU."""
    seq = engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    batch = engine.scheduler.schedule()
    logits, items = engine.runner.logits(batch)
    row = [i for i, it in enumerate(items) if it.seq is seq][0]
    out = logits[row].float().cpu()
    _finish(engine, batch, [int(out.argmax()) if it.samples else None for it in batch.items])
    return out


@torch.inference_mode()
def forced_logits(engine, ids: list[int], n: int) -> torch.Tensor:
    """The next-token logits at the last ``n`` positions of ``ids``, read in one prefill step (teacher forcing),
    float32 on the CPU."""
    seq = engine.add_request(ids, SamplingParams(max_tokens=1, ignore_eos=True))
    batch = engine.scheduler.schedule()
    if len(batch.items) != 1 or batch.items[0].num_tokens != len(ids):
        raise RuntimeError("teacher forcing needs the whole sequence in one step; raise max_num_batched_tokens")
    x = build_step_inputs(batch, engine.runner.tables, engine.device)
    last = torch.arange(len(ids) - n, len(ids), device=engine.device)
    out = engine.model(x.input_ids, x.positions, x.meta, engine.pool, last).float().cpu()
    _finish(engine, batch, [0])
    del seq
    return out
