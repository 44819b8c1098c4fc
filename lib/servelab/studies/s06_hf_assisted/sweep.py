"""The timed sweep: every method on every pair, over the prompts, within a wall-time budget, cheapest first.

The sweep runs in passes, one prompt each (:func:`plan_passes`):

1. **short** — prompt 0, every job at ``short_new_tokens`` (the drafts' own plain runs at ``cost_tokens``,
   for the cost ratio): every method at the short lengths, and each job's measured cost;
2. **long** — prompt 1, every job at ``max_new_tokens`` (the issue's longest output, 512 on the H200):
   the main target's runs before those of a draft serving as a target; for each target its plain run
   first (the baseline every other run on that target is divided by), then the rest cheapest first by
   the cost the short pass measured, so a budget that runs out drops the most expensive runs, not the
   baselines or the cheap ones;
3. **spread** — the other prompts at ``short_new_tokens``: the spread over prompts at the short lengths.

Every run is read at all output lengths up to its own (one run gives the time to every length, see
``clock.py``), so the long prompt adds to the short lengths' spread too. A job runs only if its
estimated time fits what is left of the budget; HF runs also carry HF's ``max_time`` stopping rule, so
an estimate that was too low cuts the run (status "cut", tokens made so far kept) instead of overrunning.
A job that does not run gets a row saying why (status "skipped"), and so does a failure ("oom", "error").
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servelab.studies.s06_hf_assisted.attention_backend import hf_sdpa
from servelab.studies.s06_hf_assisted.clock import per_token_ms
from servelab.studies.s06_hf_assisted.runs import METHODS, GenerationRun, Job, Pair, plan_jobs, timed_generate

ESTIMATE_MARGIN = 1.05  # a longer run costs a little more per token (longer context); HF max_time cuts the rest

# (draft name or None for the target alone, target name, prompt ids, new tokens) -> a timed run
OwnRunner = Callable[[str | None, str, list[int], int], GenerationRun]


@dataclass(frozen=True)
class Pass:
    """The jobs run on one prompt, all at the pass's output length (cost-only draft runs excepted)."""

    prompt: int
    kind: str  # "short", "long" or "spread"
    new_tokens: int
    jobs: tuple[Job, ...]


def plan_passes(
    pairs: list[Pair],
    n_prompts: int,
    *,
    max_new_tokens: int,
    short_new_tokens: int,
    cost_tokens: int,
    prompt_lookup_targets: list[str],
    own: bool,
) -> list[Pass]:
    """Short pass on prompt 0, long pass on prompt 1, spread passes on the rest (see the module docstring).

    With one prompt, or ``short_new_tokens == max_new_tokens``, there is no separate long pass: the first
    prompt runs at ``max_new_tokens``."""
    short = min(short_new_tokens, max_new_tokens)
    if n_prompts < 1:
        raise ValueError("need at least one prompt")
    if n_prompts == 1 or short == max_new_tokens:
        first = plan_jobs(pairs, max_new_tokens, min(cost_tokens, max_new_tokens), prompt_lookup_targets, own)
        spread = plan_jobs(pairs, short, min(cost_tokens, short), prompt_lookup_targets, own)
        return [Pass(0, "long", max_new_tokens, tuple(first))] + [
            Pass(i, "spread", short, tuple(spread)) for i in range(1, n_prompts)
        ]
    short_jobs = tuple(plan_jobs(pairs, short, min(cost_tokens, short), prompt_lookup_targets, own))
    targets = {p.target for p in pairs}
    long_jobs = tuple(
        j
        for j in plan_jobs(pairs, max_new_tokens, cost_tokens, prompt_lookup_targets, own)
        if not (j.method == "plain" and j.target not in targets)
    )  # draft costs: the short pass has them
    return [Pass(0, "short", short, short_jobs), Pass(1, "long", max_new_tokens, long_jobs)] + [
        Pass(i, "spread", short, short_jobs) for i in range(2, n_prompts)
    ]


class CostEstimates:
    """Seconds per new token of each job (method, target, draft), from its last completed timed run."""

    def __init__(self):
        self._s_per_token: dict[tuple, float] = {}

    def record(self, job: Job, run: GenerationRun) -> None:
        if run.made > 0 and math.isfinite(run.total_ms):
            self._s_per_token[job.key] = run.total_ms / 1e3 / run.made

    def seconds(self, job: Job, new_tokens: int) -> float | None:
        """Estimated seconds for ``new_tokens`` tokens of ``job`` (None: never measured)."""
        s = self._s_per_token.get(job.key)
        return None if s is None else s * new_tokens * ESTIMATE_MARGIN


def run_order(p: Pass, estimates: CostEstimates) -> list[Job]:
    """The long pass: target by target, the main target (the planned first) first; for each, its plain run
    first (the baseline its other runs divide by), then its other runs cheapest first by ``estimates``
    (unmeasured ones first: nothing says they are expensive). Other passes: as planned (most important
    first)."""
    if p.kind != "long":
        return list(p.jobs)
    targets = list(dict.fromkeys(j.target for j in p.jobs if j.method == "plain"))
    rank = {t: i for i, t in enumerate(targets)}
    return sorted(
        p.jobs,
        key=lambda j: (
            rank.get(j.target, len(targets)),
            j.method != "plain",
            estimates.seconds(j, j.new_tokens) or 0.0,
        ),
    )


@dataclass
class JobRunner:
    """Runs one job: HF methods through ``generate`` under the chosen SDPA kernels, the project's own through
    ``own``."""

    models: dict
    pld_tokens: int
    pad_token_id: int | None = None
    own: OwnRunner | None = None
    sdpa: str = "default"

    def __call__(self, job: Job, prompt: list[int], new_tokens: int, max_time: float | None = None) -> GenerationRun:
        if job.method in ("own", "own_plain"):
            if self.own is None:
                raise ValueError("the project's own decoder was not given")
            return self.own(job.draft if job.method == "own" else None, job.target, prompt, new_tokens)
        if job.method not in METHODS:
            raise ValueError(f"unknown method {job.method!r}; known: {METHODS}")
        target = self.models[job.target]
        kw = dict(pad_token_id=self.pad_token_id, max_time=max_time)
        if job.method == "assisted":
            kw["assistant"] = self.models[job.draft]
        if job.method == "prompt_lookup":
            kw["prompt_lookup_num_tokens"] = self.pld_tokens
        with hf_sdpa(self.sdpa):
            return timed_generate(target, prompt, new_tokens, **kw)


def sweep(
    models: dict,
    pairs: list[Pair],
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    cost_tokens: int,
    prompt_lookup_targets: list[str],
    pld_tokens: int,
    own: OwnRunner | None = None,
    budget_s: float = math.inf,
    warmup_tokens: int = 8,
    pad_token_id=None,
    short_new_tokens: int | None = None,
    sdpa: str = "default",
    progress: bool = True,
) -> tuple[pd.DataFrame, dict]:
    """The passes of :func:`plan_passes` over ``prompts`` within ``budget_s`` seconds of wall time.

    Each job first runs once untimed with ``warmup_tokens`` new tokens on prompt 0 (kernels chosen, caches
    allocated, HF's assistant set up, the own decoder's graphs captured), inside the budget. Returns (the
    runs table, one row per planned run with its status; {(prompt, job): GenerationRun} of the runs that
    made tokens)."""
    passes = plan_passes(
        pairs,
        len(prompts),
        max_new_tokens=max_new_tokens,
        short_new_tokens=short_new_tokens or max_new_tokens,
        cost_tokens=cost_tokens,
        prompt_lookup_targets=prompt_lookup_targets,
        own=own is not None,
    )
    runner = JobRunner(models, pld_tokens, pad_token_id, own, sdpa)
    with hf_warnings_off():
        return run_passes(passes, runner, prompts, budget_s=budget_s, warmup_tokens=warmup_tokens, progress=progress)


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


def run_passes(
    passes: list[Pass],
    runner: Callable,
    prompts: list[list[int]],
    *,
    budget_s: float = math.inf,
    warmup_tokens: int = 8,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[pd.DataFrame, dict]:
    """Warm every job up, then run ``passes`` with ``runner(job, prompt, new_tokens, max_time=s)`` within
    ``budget_s`` seconds of ``clock``; see :func:`sweep` for what comes back."""
    from tqdm.auto import tqdm

    t0 = clock()

    def left() -> float:
        return budget_s - (clock() - t0)

    broken = _warm_up(passes, runner, prompts[0], warmup_tokens, left)
    estimates = CostEstimates()
    rows, runs = [], {}
    bar = tqdm(total=sum(len(p.jobs) for p in passes), desc="generate runs", disable=not progress, leave=False)
    for p in passes:
        prompt = prompts[p.prompt]
        baselines: set[str] = set()  # targets whose plain run made tokens on this prompt
        for job in run_order(p, estimates):
            row = dict(
                prompt=p.prompt,
                prompt_tokens=len(prompt),
                pass_kind=p.kind,
                method=job.method,
                target=job.target,
                draft=job.draft or "",
                pair=job.pair,
                new_tokens=job.new_tokens,
                status="ok",
                error="",
            )
            why = _why_not(job, broken, baselines, left(), estimates)
            if why:
                row.update(status=why[0], error=why[1])
            else:
                row.update(_timed_job(runner, job, p.prompt, prompt, left(), estimates, runs, baselines))
            rows.append(row)
            bar.update(1)
    bar.close()
    return _add_matches(pd.DataFrame(rows), runs), runs


def _warm_up(passes: list[Pass], runner: Callable, prompt: list[int], tokens: int, left: Callable) -> dict:
    """Run every job once, untimed, on ``prompt``: {job key: "status: error"} for those that failed."""
    broken: dict[tuple, str] = {}
    warm = {j.key: j for p in passes for j in p.jobs}  # once per job, whatever its length (in planned order)
    for job in warm.values():
        if left() <= 0:
            break
        try:
            runner(job, prompt, tokens, max_time=left())
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            broken[job.key] = f"{_status(e)}: {_error_text(e)}"
            _free_cuda()
    return broken


def _timed_job(runner, job: Job, index: int, prompt, left_s: float, estimates, runs: dict, baselines: set) -> dict:
    """One timed run: the columns it adds to its row (status "cut" if the budget stopped it, a failure's status)."""
    try:
        run = runner(job, prompt, job.new_tokens, max_time=left_s)
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        _free_cuda()
        return dict(status=_status(e), error=_error_text(e))
    if run.made > 0:
        runs[(index, job)] = run
    estimates.record(job, run)
    out = _describe(run)
    if run.made < job.new_tokens:
        out.update(status="cut", error=f"stopped at the wall-time budget after {run.made} of {job.new_tokens} tokens")
    if job.method == "plain" and run.made > 0:
        baselines.add(job.target)
    return out


def _why_not(job: Job, broken: dict, baselines: set, left_s: float, estimates: CostEstimates) -> tuple | None:
    """(status, reason) if ``job`` should not run now, else None."""
    if job.key in broken:
        return broken[job.key].split(":")[0], broken[job.key]
    if left_s <= 0:
        return "skipped", "the wall-time budget is spent"
    if job.method != "plain" and job.target not in baselines:
        return "skipped", f"no plain generate of {job.target} on this prompt to compare with"
    est = estimates.seconds(job, job.new_tokens)
    if est is not None and est > left_s:
        return "skipped", f"would not fit the wall-time budget: needs ≈{est:.0f} s, {left_s:.0f} s left"
    return None


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


def _describe(run: GenerationRun) -> dict:
    pt = per_token_ms(run.counts, run.ms)
    steps = len(run.counts)
    return dict(
        **run.extra,
        made_tokens=run.made,
        total_ms=run.total_ms,
        steps=steps,
        tokens_per_step=run.made / steps if steps else np.nan,
        first_step_ms=float(run.ms[0]) if steps else np.nan,
        ms_per_token_median=float(np.median(pt)) if len(pt) else np.nan,
        ms_per_token_p25=float(np.percentile(pt, 25)) if len(pt) else np.nan,
        ms_per_token_p75=float(np.percentile(pt, 75)) if len(pt) else np.nan,
    )


def _add_matches(table: pd.DataFrame, runs: dict) -> pd.DataFrame:
    """Does each run's output equal plain greedy of its target on the same prompt, token for token?

    ``matches_plain`` (1.0 / 0.0) and ``matching_prefix`` (share of the tokens both made before the first
    difference), over the tokens both runs made (a cut run is compared on its prefix); NaN for plain runs
    themselves and where either run made nothing."""
    by_key = {(i, j.method, j.target, j.draft or ""): r for (i, j), r in runs.items()}
    exact, prefix = [], []
    for row in table.itertuples():
        run = by_key.get((row.prompt, row.method, row.target, row.draft))
        ref = by_key.get((row.prompt, "plain", row.target, ""))
        n = min(len(run.tokens), len(ref.tokens)) if run is not None and ref is not None else 0
        if row.method == "plain" or n == 0:
            exact.append(np.nan)
            prefix.append(np.nan)
            continue
        a, b = run.tokens[:n], ref.tokens[:n]
        same = next((k for k in range(n) if a[k] != b[k]), n)
        exact.append(float(same == n))
        prefix.append(same / n)
    return table.assign(matches_plain=exact, matching_prefix=prefix)
