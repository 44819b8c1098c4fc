"""Timed greedy generate runs: plain, with an assistant model, with prompt lookup; the jobs of one prompt.

Each run is one ``generate`` call with ``max_new_tokens == min_new_tokens`` (so every run makes the same
number of tokens: end-of-text is suppressed, identically in every method) and a :class:`TokenClock`,
so the time to reach each output length is read from the one run. :mod:`servelab.studies.s06_hf_assisted.sweep` runs
the jobs over the prompts within a wall-time budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

METHODS = ("plain", "assisted", "prompt_lookup", "own_plain", "own")
DONE = ("ok", "cut")  # statuses of runs that produced tokens (a cut run stopped early at the budget)


@dataclass(frozen=True)
class Pair:
    """A draft → target pair (model names)."""

    draft: str
    target: str

    @property
    def name(self) -> str:
        return f"{self.draft} → {self.target}"


@dataclass
class GenerationRun:
    """One timed generate: the new tokens, and (cumulative new tokens, ms) at each streamer put."""

    tokens: list[int]
    counts: np.ndarray
    ms: np.ndarray
    extra: dict = field(default_factory=dict)
    dense: bool = True  # a mark after every step; False: the total only (read at the last token alone)

    @property
    def total_ms(self) -> float:
        return float(self.ms[-1]) if len(self.ms) else float("nan")

    @property
    def made(self) -> int:
        """New tokens the run made."""
        return int(self.counts[-1]) if len(self.counts) else 0


def hf_eos_ids(model) -> tuple[int, ...]:
    """The ids HF's ``min_new_tokens`` holds back for ``model``: its generation config's EOS (an id or a list), else
    its config's. The engine rows and α hold back the same ones, so that all three run one semantics."""
    from servelab.engine.engine import eos_ids

    return eos_ids(getattr(model, "generation_config", None)) or eos_ids(model.config)


def timed_generate(
    model,
    prompt: list[int],
    max_new_tokens: int,
    *,
    assistant=None,
    prompt_lookup_num_tokens: int | None = None,
    pad_token_id: int | None = None,
    max_time: float | None = None,
) -> GenerationRun:
    """Greedy ``model.generate`` of exactly ``max_new_tokens`` tokens, timed per streamed batch.

    ``max_time`` (s): HF's own stopping rule, so a run cannot overrun a wall-time budget; a run it stops
    makes fewer tokens (``GenerationRun.made``)."""
    import torch

    from servelab.studies.s06_hf_assisted.clock import TokenClock

    dev = model.device
    ids = torch.tensor([prompt], dtype=torch.long, device=dev)
    clock = TokenClock(cuda=dev.type == "cuda")
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        attention_mask=torch.ones_like(ids),
        streamer=clock,
    )
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup_num_tokens:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    if max_time is not None and max_time != float("inf"):
        kwargs["max_time"] = max(0.001, float(max_time))
    with torch.inference_mode():
        clock.start()
        out = model.generate(ids, **kwargs)
    counts, ms = clock.marks()
    return GenerationRun(out[0, ids.shape[1] :].tolist(), counts, ms)


@dataclass(frozen=True)
class Job:
    """One run of the sweep: ``method`` on ``target`` (with ``draft`` where the method has one)."""

    method: str
    target: str
    draft: str | None
    new_tokens: int

    @property
    def pair(self) -> str:
        return f"{self.draft} → {self.target}" if self.draft else self.target

    @property
    def key(self) -> tuple[str, str, str | None]:
        """The job whatever its length: (method, target, draft)."""
        return self.method, self.target, self.draft


def plan_jobs(
    pairs: list[Pair], max_new_tokens: int, cost_tokens: int, prompt_lookup_targets: list[str], own: bool
) -> list[Job]:
    """The runs for one prompt, most important first (a budget cut drops the tail): the first target's
    plain runs, the drafts' plain runs (``cost_tokens``, for cost ratios), the first target's assisted
    pairs, prompt lookup, then the other targets (plain, assisted), then the project's own implementation
    (its plain target, then each pair)."""
    targets = list(dict.fromkeys(p.target for p in pairs))
    drafts = [d for d in dict.fromkeys(p.draft for p in pairs) if d not in targets]
    jobs = [Job("plain", targets[0], None, max_new_tokens)]
    jobs += [Job("plain", d, None, cost_tokens) for d in drafts]
    jobs += [Job("assisted", p.target, p.draft, max_new_tokens) for p in pairs if p.target == targets[0]]
    jobs += [Job("prompt_lookup", t, None, max_new_tokens) for t in prompt_lookup_targets]
    for t in targets[1:]:
        jobs.append(Job("plain", t, None, max_new_tokens))
        jobs += [Job("assisted", p.target, p.draft, max_new_tokens) for p in pairs if p.target == t]
    if own:
        jobs += [Job("own_plain", t, None, max_new_tokens) for t in targets]
        jobs += [Job("own", p.target, p.draft, max_new_tokens) for p in pairs]
    return jobs


def times_at_lengths(runs: dict, lengths: list[int]) -> pd.DataFrame:
    """Tidy: one row per run and output length k: ms until k tokens existed (k ≤ the tokens the run made;
    a run without a mark per step, only at its last token)."""
    from servelab.studies.s06_hf_assisted.clock import time_to_tokens  # transformers' streamer: the GPU's side only

    rows = []
    for (i, job), run in runs.items():
        for k in lengths:
            if k > run.made or (not run.dense and k != run.made):
                continue
            rows.append(
                dict(
                    prompt=i,
                    method=job.method,
                    target=job.target,
                    draft=job.draft or "",
                    pair=job.pair,
                    length=k,
                    ms=time_to_tokens(run.counts, run.ms, k),
                )
            )
    return pd.DataFrame(rows, columns=["prompt", "method", "target", "draft", "pair", "length", "ms"])


ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def assistant_settings(draft) -> dict:
    """The assistant settings ``generate`` will use for ``draft``: its generation config where set, else HF's
    defaults (read from transformers itself, so the record follows the installed version)."""
    from transformers import GenerationConfig

    try:
        defaults = GenerationConfig._get_default_generation_params()
    except AttributeError:  # other transformers versions: the defaults live on the config object
        defaults = {k: getattr(GenerationConfig(), k, None) for k in ASSISTANT_KEYS}
    own = draft.generation_config
    return {k: getattr(own, k, None) if getattr(own, k, None) is not None else defaults.get(k) for k in ASSISTANT_KEYS}
