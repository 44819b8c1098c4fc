"""Study 3's measurements: acceptance and speedup per draft × γ × temperature, and the Leviathan prediction.

Every point generates the same held-out prompts, speculatively and plainly (the autoregressive baseline
on the same target, same engine path), timing each generation ``repeats`` times after a warm-up (CUDA
events around the whole generation, which syncs with the host every step anyway). A point that fails
(OOM, an error) or that the time budget leaves out is a row with its status, not a dead notebook.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pandas as pd
import torch
from scipy import stats

from servelab.engine.sequence import SamplingParams
from servelab.measure import time_fn
from servelab.spec import leviathan
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


def _median_ci(x: np.ndarray) -> tuple[float, float, float]:
    med = float(np.median(x))
    if len(x) >= 3 and np.ptp(x) > 0:
        ci = stats.bootstrap(
            (x,), np.median, confidence_level=0.95, n_resamples=999, method="percentile", random_state=0
        ).confidence_interval
        return med, float(ci.low), float(ci.high)
    return med, med, med


SPEEDUP_COLUMNS = [
    "target",
    "draft",
    "gamma",
    "temperature",
    "prompts",
    "alpha",
    "acceptance_rate",
    "mean_gamma",
    "tokens_per_round",
    "ms_per_token",
    "baseline_ms_per_token",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "c",
    "predicted_speedup",
    "prediction_error_pct",
    "c_in_loop",
    "predicted_speedup_in_loop",
    "prediction_error_in_loop_pct",
    "rollback_share_pct",
    "draft_share_pct",
    "verify_share_pct",
    "greedy_exact_match",
    "speedup_vs_chained",
    "speedup_vs_chained_ci_low",
    "speedup_vs_chained_ci_high",
]


def speedup_table(sweep: pd.DataFrame, c_by_pair: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Per (target, draft, γ, temperature): α (MLE) and acceptance rate, tokens per round, the measured speedup
    (median over prompts of the target-alone time over the speculative time, with a bootstrap CI), and the
    Leviathan prediction from the measured α and ``c_by_pair[(draft, target)]``, with its error."""
    if sweep.empty or "ms" not in sweep:
        return pd.DataFrame(columns=SPEEDUP_COLUMNS)
    ok = sweep[sweep["status"] == "ok"]
    base = ok[ok.method == "autoregressive"].set_index(["target", "temperature", "prompt"])
    chained = ok[ok.method == "autoregressive_chained"].set_index(["target", "temperature", "prompt"])
    rows = []
    for (tg, d, g, T), grp in ok[ok.method == "speculative"].groupby(
        ["target", "draft", "gamma", "temperature"], sort=False
    ):
        keys = [(tg, T, p) for p in grp.prompt if (tg, T, p) in base.index]
        if not keys:
            continue
        grp = grp.set_index("prompt").loc[[p for _, _, p in keys]]
        ratio = base.loc[keys, "ms"].to_numpy() / grp["ms"].to_numpy()
        sp, lo, hi = _median_ci(ratio)
        acc, rej, prop, rounds = grp.accepted.sum(), grp.rejections.sum(), grp.proposed.sum(), grp.rounds.sum()
        alpha = leviathan.alpha_mle(int(acc), int(rej))
        mean_gamma = prop / rounds
        c = c_by_pair.get((d, tg), float("nan"))
        pred = (
            float(leviathan.improvement(alpha, mean_gamma, c))
            if np.isfinite(c) and np.isfinite(alpha)
            else float("nan")
        )
        exact = float("nan")
        if T == 0:
            exact = float(np.mean(base.loc[keys, "output"].to_numpy() == grp["output"].to_numpy()))
        total_ms = grp.ms.sum()
        ck = [k for k in keys if k in chained.index]
        vs_chained = (
            _median_ci(chained.loc[ck, "ms"].to_numpy() / grp.loc[[p for _, _, p in ck], "ms"].to_numpy())
            if ck
            else (float("nan"),) * 3
        )
        # c as the loop itself ran it: a draft step's host-synced time over a plain decode step's
        c_loop = (grp.draft_ms.sum() / prop) / float(np.median(base.loc[keys, "ms_per_token"]))
        pred_loop = float(leviathan.improvement(alpha, mean_gamma, c_loop)) if np.isfinite(alpha) else float("nan")
        rows.append(
            dict(
                target=tg,
                draft=d,
                gamma=g,
                temperature=T,
                prompts=len(keys),
                alpha=alpha,
                acceptance_rate=acc / prop,
                mean_gamma=mean_gamma,
                tokens_per_round=grp.tokens.sum() / rounds,
                ms_per_token=float(np.median(grp.ms_per_token)),
                baseline_ms_per_token=float(np.median(base.loc[keys, "ms_per_token"])),
                speedup=sp,
                speedup_ci_low=lo,
                speedup_ci_high=hi,
                c=c,
                predicted_speedup=pred,
                prediction_error_pct=100 * (pred - sp) / sp,
                c_in_loop=c_loop,
                predicted_speedup_in_loop=pred_loop,
                prediction_error_in_loop_pct=100 * (pred_loop - sp) / sp,
                rollback_share_pct=100 * grp.rollback_ms.sum() / total_ms,
                draft_share_pct=100 * grp.draft_ms.sum() / total_ms,
                verify_share_pct=100 * grp.verify_ms.sum() / total_ms,
                greedy_exact_match=exact,
                speedup_vs_chained=vs_chained[0],
                speedup_vs_chained_ci_low=vs_chained[1],
                speedup_vs_chained_ci_high=vs_chained[2],
            )
        )
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def pays_map(alphas: np.ndarray, cs: np.ndarray, max_gamma: int = 8) -> pd.DataFrame:
    """The best predicted improvement over γ ≤ ``max_gamma`` on a grid of α × c (the map of where speculation pays)."""
    rows = []
    for a in alphas:
        for c in cs:
            g, imp = leviathan.best_gamma(float(a), float(c), max_gamma)
            rows.append(dict(alpha=float(a), c=float(c), best_gamma=g, improvement=imp))
    return pd.DataFrame(rows)
