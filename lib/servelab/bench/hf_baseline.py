"""HF ``generate`` with static batching on the offline workload: the baseline the engine is compared with.

Static batching: requests run in fixed batches (left-padded prompts); a batch runs until its longest
output is done, so finished requests keep occupying their row. HF eager needs tens of ms per step,
so the whole workload would take minutes: ``hf_static_throughput`` runs the first batch for at most
``time_budget_s`` seconds and counts the *useful* tokens produced so far (each request's tokens up to
its own output length). Early steps waste nothing (every request still wants tokens), so this rate is
an upper bound on HF's rate over the full workload, and the engine's speedup over it a lower bound.
"""

from __future__ import annotations

import time

import torch

from servelab.bench.workload import OfflineWorkload


class _Deadline:
    """A ``StoppingCriteria`` that stops generation after ``seconds`` of wall time and counts steps."""

    def __init__(self, seconds: float):
        self.seconds, self.t0, self.steps = seconds, None, 0

    def __call__(self, input_ids, scores, **kwargs):
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.steps += 1
        done = time.perf_counter() - self.t0 > self.seconds
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


@torch.inference_mode()
def hf_static_throughput(
    model, workload: OfflineWorkload, *, batch_size: int = 64, time_budget_s: float = 20.0, temperature: float = 0.6
) -> dict:
    """Useful output tokens per second of HF ``generate`` on the workload's first ``batch_size`` requests."""
    from transformers import StoppingCriteriaList

    w = workload.head(batch_size)
    dev = model.device
    width = max(len(p) for p in w.prompts)
    pad = 0
    ids = torch.full((len(w.prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(w.prompts):  # left padding: every row's last prompt token sits at the same column
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    deadline = _Deadline(time_budget_s)
    kw = dict(
        do_sample=temperature > 0,
        max_new_tokens=max(w.output_lens),
        min_new_tokens=max(w.output_lens),
        pad_token_id=pad,
        stopping_criteria=StoppingCriteriaList([deadline]),
    )
    if temperature > 0:
        kw.update(temperature=temperature, top_p=1.0, top_k=0)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    sync()
    elapsed = time.perf_counter() - t0
    generated = out.shape[1] - width
    useful = sum(min(generated, n) for n in w.output_lens)
    return {
        "batch_size": len(w.prompts),
        "generated_steps": generated,
        "useful_tokens": useful,
        "elapsed_s": elapsed,
        "tok_s": useful / elapsed,
        "complete": generated >= max(w.output_lens),
    }
