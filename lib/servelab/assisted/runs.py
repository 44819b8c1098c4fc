"""Timed greedy generate runs: plain, with an assistant model, with prompt lookup, and the sweep.

Each run is one ``generate`` call with ``max_new_tokens == min_new_tokens`` (so every run makes the same
number of tokens: end-of-text is suppressed, identically in every method) and a :class:`TokenClock`,
so the time to reach each output length is read from the one run.

The sweep runs prompt by prompt, all methods on one prompt before the next, so a wall-time budget that
runs out leaves whole prompts rather than missing methods (only a first prompt slower than the whole
budget loses the methods at the end of its list, recorded as skipped).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from servelab.assisted.clock import TokenClock, per_token_ms, time_to_tokens

METHODS = ("plain", "assisted", "prompt_lookup", "own_plain", "own")


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
    dense: bool = True      # a mark after every step; False: the total only (read at the last token alone)

    @property
    def total_ms(self) -> float:
        return float(self.ms[-1]) if len(self.ms) else float("nan")


def timed_generate(model, prompt: list[int], max_new_tokens: int, *, assistant=None,
                   prompt_lookup_num_tokens: int | None = None, pad_token_id: int | None = None) -> GenerationRun:
    """Greedy ``model.generate`` of exactly ``max_new_tokens`` tokens, timed per streamed batch."""
    import torch

    dev = model.device
    ids = torch.tensor([prompt], dtype=torch.long, device=dev)
    clock = TokenClock(cuda=dev.type == "cuda")
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                  attention_mask=torch.ones_like(ids), streamer=clock)
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup_num_tokens:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    with torch.inference_mode():
        clock.start()
        out = model.generate(ids, **kwargs)
    counts, ms = clock.marks()
    return GenerationRun(out[0, ids.shape[1]:].tolist(), counts, ms)


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


def plan_jobs(pairs: list[Pair], max_new_tokens: int, cost_tokens: int, prompt_lookup_targets: list[str],
              own: bool) -> list[Job]:
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


# (draft name or None for the target alone, target name, prompt ids, new tokens) -> a timed run
OwnRunner = Callable[[str | None, str, list[int], int], GenerationRun]


def _run_job(job: Job, models: dict, prompt: list[int], *, pld_tokens: int, pad_token_id, own: OwnRunner | None,
             new_tokens: int | None = None) -> GenerationRun:
    n = new_tokens or job.new_tokens
    target = models[job.target]
    if job.method == "plain":
        return timed_generate(target, prompt, n, pad_token_id=pad_token_id)
    if job.method == "assisted":
        return timed_generate(target, prompt, n, assistant=models[job.draft], pad_token_id=pad_token_id)
    if job.method == "prompt_lookup":
        return timed_generate(target, prompt, n, prompt_lookup_num_tokens=pld_tokens, pad_token_id=pad_token_id)
    if job.method == "own_plain":
        return own(None, job.target, prompt, n)
    if job.method == "own":
        return own(job.draft, job.target, prompt, n)
    raise ValueError(f"unknown method {job.method!r}; known: {METHODS}")


def _status(e: BaseException) -> str:
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "oom"
    return "error"


def _error_text(e: BaseException) -> str:
    """The exception's type and first line, short enough for a table cell."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"[:300]


def _free_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sweep(models: dict, pairs: list[Pair], prompts: list[list[int]], *, max_new_tokens: int, cost_tokens: int,
          prompt_lookup_targets: list[str], pld_tokens: int, own: OwnRunner | None = None,
          budget_s: float = float("inf"), warmup_tokens: int = 8, pad_token_id=None,
          followup_new_tokens: int | None = None, progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """Every job of :func:`plan_jobs` on every prompt, within ``budget_s`` seconds of wall time.

    The first prompt's runs make ``max_new_tokens`` tokens; with ``followup_new_tokens`` the later
    prompts' runs make only that many (more prompts in the budget: the spread over prompts at the
    shorter lengths, the longest lengths from the first prompt alone). A prompt starts only if its
    estimated time still fits; within a prompt, jobs after the budget is spent are recorded as
    "skipped" (only the first prompt can get there).

    Each job runs once untimed on the first prompt with ``warmup_tokens`` new tokens (kernels chosen,
    caches allocated, HF's assistant set up). Returns (runs table, {(prompt, job): GenerationRun}).
    A failing job gets a row with status "oom" or "error" and the sweep goes on.
    """
    jobs = plan_jobs(pairs, max_new_tokens, cost_tokens, prompt_lookup_targets, own is not None)
    kw = dict(pld_tokens=pld_tokens, pad_token_id=pad_token_id, own=own)
    followup = min(followup_new_tokens or max_new_tokens, max_new_tokens)
    with hf_warnings_off():
        return _sweep(jobs, models, prompts, kw, budget_s, warmup_tokens, followup, progress)


@contextlib.contextmanager
def hf_warnings_off():
    """HF warns on every assisted call that it builds a logits processor we also asked for (min_new_tokens)
    and about the assistant's generation config: true, harmless, and noise in a notebook."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _sweep(jobs, models, prompts, kw, budget_s, warmup_tokens, followup, progress):
    from tqdm.auto import tqdm

    t0 = time.perf_counter()  # the budget covers the warm-up too (the own decoder captures graphs there)
    broken: dict[Job, str] = {}
    for job in jobs:  # warm-up
        try:
            _run_job(job, models, prompts[0], new_tokens=warmup_tokens, **kw)
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            broken[job] = f"{_status(e)}: {_error_text(e)}"
            _free_cuda()

    rows, runs = [], {}
    per_prompt_s: list[float] = []
    bar = tqdm(total=len(prompts) * len(jobs), desc="generate runs", disable=not progress)
    share = followup / jobs[0].new_tokens  # later prompts' share of the first prompt's tokens
    for i, prompt in enumerate(prompts):
        elapsed = time.perf_counter() - t0
        estimate = float(np.mean(per_prompt_s[1:])) if i > 1 else (per_prompt_s[0] * share if i else 0.0)
        if i > 0 and elapsed + estimate > budget_s:
            break  # the next prompt would not fit: stop with whole prompts
        tp = time.perf_counter()
        for planned in jobs:
            job = planned if i == 0 else replace(planned, new_tokens=min(planned.new_tokens, followup))
            row = dict(prompt=i, prompt_tokens=len(prompt), method=job.method, target=job.target,
                       draft=job.draft or "", pair=job.pair, new_tokens=job.new_tokens, status="ok", error="")
            if planned in broken:
                row.update(status=broken[planned].split(":")[0], error=broken[planned])
            elif time.perf_counter() - t0 > budget_s:
                row.update(status="skipped", error=f"wall-time budget of {budget_s:.0f} s spent")
            else:
                try:
                    run = _run_job(job, models, prompt, **kw)
                    runs[(i, job)] = run
                    row.update(_describe(run))
                except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                    row.update(status=_status(e), error=_error_text(e))
                    _free_cuda()
            rows.append(row)
            bar.update(1)
        per_prompt_s.append(time.perf_counter() - tp)
    bar.close()
    table = pd.DataFrame(rows)
    return _add_matches(table, runs), runs


def _describe(run: GenerationRun) -> dict:
    pt = per_token_ms(run.counts, run.ms)
    steps = len(run.counts)
    made = int(run.counts[-1]) if steps else 0
    return dict(**run.extra, made_tokens=made, total_ms=run.total_ms, steps=steps,
                tokens_per_step=made / steps if steps else np.nan,
                first_step_ms=float(run.ms[0]) if steps else np.nan,
                ms_per_token_median=float(np.median(pt)) if len(pt) else np.nan,
                ms_per_token_p25=float(np.percentile(pt, 25)) if len(pt) else np.nan,
                ms_per_token_p75=float(np.percentile(pt, 75)) if len(pt) else np.nan)


def _add_matches(table: pd.DataFrame, runs: dict) -> pd.DataFrame:
    """Does each run's output equal plain greedy of its target on the same prompt, token for token?

    ``matches_plain`` (bool) and ``matching_prefix`` (share of the reference's tokens before the first
    difference); NaN for plain runs themselves and where either run failed.
    """
    by_key = {(i, j.method, j.target, j.draft or ""): r for (i, j), r in runs.items()}
    exact, prefix = [], []
    for row in table.itertuples():
        run = by_key.get((row.prompt, row.method, row.target, row.draft))
        ref = by_key.get((row.prompt, "plain", row.target, ""))
        if row.method == "plain" or run is None or ref is None:
            exact.append(np.nan)
            prefix.append(np.nan)
            continue
        a, b = run.tokens, ref.tokens
        n = min(len(a), len(b))
        same = next((k for k in range(n) if a[k] != b[k]), n)
        exact.append(float(a == b))
        prefix.append(same / max(1, len(b)))
    return table.assign(matches_plain=exact, matching_prefix=prefix)


def times_at_lengths(table: pd.DataFrame, runs: dict, lengths: list[int]) -> pd.DataFrame:
    """Tidy: one row per run and output length k: ms until k tokens existed (k ≤ the run's tokens)."""
    rows = []
    for (i, job), run in runs.items():
        for k in lengths:
            if k > job.new_tokens or (not run.dense and k != int(run.counts[-1])):
                continue
            rows.append(dict(prompt=i, method=job.method, target=job.target, draft=job.draft or "", pair=job.pair,
                             length=k, ms=time_to_tokens(run.counts, run.ms, k)))
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
