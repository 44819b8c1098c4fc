"""Study 3's generation sweep: every draft × γ × temperature point generating the same held-out prompts.

Every point generates the same held-out prompts, speculatively and plainly (the autoregressive baseline
on the same target, same engine path), timing each generation ``repeats`` times after a warm-up (CUDA
events around the whole generation, which syncs with the host every step anyway). A point that fails
(OOM, an error) or that the time budget leaves out is a row with its status, not a dead notebook.
"""

from __future__ import annotations

import functools
import time

import pandas as pd
import torch

from servelab.engine.sequence import SamplingParams
from servelab.measure import time_fn
from servelab.spec.decoder import SpeculativeDecoder, autoregressive, autoregressive_chained
from servelab.spec.paged_lm import PagedLM


def _timed(fn, device, warmup: int, repeats: int):
    """``(Timing, last result)`` of ``fn()``."""
    box = {}

    def run():
        box["r"] = fn()

    t = time_fn(run, warmup=warmup, repeats=repeats, device=device)
    return t, box["r"]


def _status(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "oom"
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"error: {type(e).__name__}: {msg}"


def generation_sweep(
    models: dict[str, PagedLM],
    pairs: list[tuple[str, str]],
    prompts: list[list[int]],
    gammas: list,
    temperatures: list[float],
    max_new_tokens: int,
    *,
    warmup: int = 1,
    repeats: int = 2,
    seed: int = 0,
    time_budget_s: float | None = None,
    chain_steps: int | None = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (method, target, draft, γ, temperature, prompt): ms per generation (median, p25, p75), tokens,
    the rounds' acceptance counts and phase times. ``method`` is "autoregressive" (each target alone, a host
    round trip per token, as the engine decodes by default), "autoregressive_chained" (``chain_steps`` tokens
    per round trip, the engine's multi-step decoding: the stronger baseline; None leaves it out) or
    "speculative" (each (draft, target) pair of ``pairs``, names of ``models``).

    ``warmup`` untimed generations run once per point (on its first prompt): a point's state (its decoder, the
    graphs it replays) is the same for every prompt."""
    from tqdm.auto import tqdm

    targets = list(dict.fromkeys(t for _, t in pairs))
    points = [(T, None, t, None) for T in temperatures for t in targets]
    if chain_steps:
        points += [(T, None, t, "chained") for T in temperatures for t in targets]
    points += [(T, d, t, g) for T in temperatures for d, t in pairs for g in gammas]
    decoders, rows, t_start = {}, [], time.perf_counter()
    bar = tqdm(total=len(points) * len(prompts), desc="speculative sweep", disable=not progress)
    # prompt-major: if the time budget runs out, every point keeps the prompts done so far
    for i, prompt in enumerate(prompts):
        for T, dname, tname, gamma in points:
            bar.update(1)
            method = "speculative" if dname else "autoregressive_chained" if gamma == "chained" else "autoregressive"
            base = dict(
                method=method,
                target=tname,
                draft=dname or "",
                gamma=str(gamma) if dname else "",
                temperature=float(T),
                prompt=i,
            )
            if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
                rows.append(base | dict(status="skipped: time budget"))
                continue
            sp = SamplingParams(max_tokens=max_new_tokens, temperature=float(T), seed=seed + i, ignore_eos=True)
            target = models[tname]
            wu = warmup if i == 0 else 0
            try:
                if method == "autoregressive":
                    t, gen = _timed(functools.partial(autoregressive, target, prompt, sp), target.device, wu, repeats)
                elif method == "autoregressive_chained":
                    fn = functools.partial(autoregressive_chained, target, prompt, sp, chain_steps)
                    t, gen = _timed(fn, target.device, wu, repeats)
                else:
                    if (dname, tname, gamma) not in decoders:
                        decoders[(dname, tname, gamma)] = SpeculativeDecoder(target, models[dname], gamma=gamma)
                    dec = decoders[(dname, tname, gamma)]
                    t, gen = _timed(functools.partial(dec.generate, prompt, sp), target.device, wu, repeats)
            except Exception as e:  # noqa: BLE001
                rows.append(base | dict(status=_status(e)))
                continue
            finally:
                target.reset()
                if dname is not None:
                    models[dname].reset()
            r = gen.rounds
            rows.append(
                base
                | dict(
                    status="ok",
                    tokens=len(gen.tokens),
                    ms=t.median_ms,
                    ms_p25=t.p25_ms,
                    ms_p75=t.p75_ms,
                    ms_per_token=t.median_ms / len(gen.tokens),
                    rounds=len(r),
                    accepted=gen.accepted,
                    proposed=gen.proposed,
                    rejections=gen.rejections,
                    draft_ms=1e3 * sum(x.draft_s for x in r),
                    verify_ms=1e3 * sum(x.verify_s for x in r),
                    rollback_ms=1e3 * sum(x.rollback_s for x in r),
                    catch_up_rounds=sum(x.draft_rows_first == 2 for x in r),
                    output=" ".join(map(str, gen.tokens)),
                )
            )
    bar.close()
    return pd.DataFrame(rows)
