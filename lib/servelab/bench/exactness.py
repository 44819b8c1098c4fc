"""Does the engine compute what HF computes on the same weights?

Greedy decoding from the same prompts, token by token: the step where the two first disagree, and
the largest logit difference on the prompt's last position (the prefill). In float32 the tokens agree
exactly (the CPU tests assert it); in bf16 both round differently, and with random weights the top two
logits are often within rounding of each other, so greedy paths may part after some steps: the logit
error says whether that is rounding or a bug. Teacher forcing (both read HF's greedy continuation)
gives the per-step argmax agreement without that cascade.
"""

from __future__ import annotations

import pandas as pd
import torch

from servelab.engine.engine import Engine
from servelab.engine.logit_probe import forced_logits, prefill_logits
from servelab.engine.sequence import SamplingParams


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """HF ``generate`` greedy tokens and the prefill's last-position logits (float32, CPU).

    EOS is turned off, not held back: ``min_new_tokens`` would mask its logit until the last step, so wherever EOS
    is the argmax HF would pick the runner-up while the engine (``ignore_eos``, which only keeps going past EOS)
    picks EOS, and the two would part there without either being wrong."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=steps,
        eos_token_id=None,
        pad_token_id=0,
    )
    if out.shape[1] != len(prompt) + steps:
        raise RuntimeError(f"HF generate stopped after {out.shape[1] - len(prompt)} of {steps} tokens: EOS stayed on")
    logits = model(input_ids=ids).logits[0, -1].float().cpu()
    return out[0, len(prompt) :].tolist(), logits


@torch.inference_mode()
def teacher_forced(hf_model, engine: Engine, prompt: list[int], continuation: list[int]) -> dict:
    """Both models read ``prompt + continuation``; compare their next-token logits at every continuation step.

    Unlike free-running greedy decoding, one near-tie does not send the two down different paths, so
    the agreement rate and the logit error are measured over every step.
    """
    ids, n = prompt + continuation[:-1], len(continuation)
    ours = forced_logits(engine, ids, n)
    ref = hf_model(input_ids=torch.tensor([ids], device=hf_model.device)).logits[0, -n:].float().cpu()
    return {
        "tf_argmax_agree_frac": float((ours.argmax(-1) == ref.argmax(-1)).float().mean()),
        "tf_logit_max_abs_err": float((ours - ref).abs().max()),
    }


def _agreeing(mine: list[int], ref: list[int]) -> int:
    """Tokens of ``mine`` that agree with ``ref`` before the first difference."""
    return next((k for k, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b), min(len(mine), len(ref)))


def greedy_agreement(hf_model, engine: Engine, prompts: list[list[int]], steps: int) -> pd.DataFrame:
    """One row per prompt: tokens agreeing before the first difference, logit errors at the prefill, and the
    teacher-forced agreement over HF's greedy continuation. The prompts decode together (batch ``len(prompts)``),
    and each once more alone (``alone_agree``): a one-row step takes the engine's own batch-1 path (small_linear's
    blocks, where ``small_batch`` is on), which the batched run never reaches."""
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    ours = engine.generate(prompts, params)
    alone = [engine.generate([p], params)[0] for p in prompts]
    rows = []
    for i, (p, mine) in enumerate(zip(prompts, ours, strict=True)):
        ref, ref_logits = hf_greedy(hf_model, p, steps)
        agree = _agreeing(mine, ref)
        got = prefill_logits(engine, p)
        top2 = ref_logits.topk(2).values
        rows.append(
            {
                "prompt": i,
                "prompt_len": len(p),
                "steps": steps,
                "tokens_agree": agree,
                "all_agree": agree == steps,
                "alone_agree": _agreeing(alone[i], ref),
                "logit_max_abs_err": float((got - ref_logits).abs().max()),
                "logit_ref_abs_max": float(ref_logits.abs().max()),
                "ref_top1_top2_gap": float(top2[0] - top2[1]),
                **teacher_forced(hf_model, engine, p, ref),
            }
        )
    return pd.DataFrame(rows)
