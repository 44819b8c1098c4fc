"""Study 3's derived tables, computed at render time from the runs' raw rows (the reporting path's).

- ``speedup_table``: per (target, draft, γ, temperature) of the generation sweep (``sweep.generation_sweep``): α,
  the measured speedup with a bootstrap CI over prompts, and Leviathan's prediction; ``pays_map``, the map of α × c;
- ``cost_ratios``: c = T_draft / T_target per pair and execution mode from the timed steps (``cost_ratio.step_costs``);
- ``controlled_table``, ``best_gamma_rows``, ``break_even_alpha``: the controlled-acceptance curves
  (``controlled.controlled_sweep``'s raw repeats) and the α above which each pair pays per batch;
- ``lookup_table``: prompt lookup's tokens/s in the batched loop (``lookup_speed.lookup_sweep``'s raw repeats).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from servelab.spec import leviathan


def _spread(x: np.ndarray) -> tuple[float, float, float]:
    return float(np.median(x)), float(np.min(x)), float(np.max(x))


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
        if T == 0 and "output" in grp:  # the legacy run kept no outputs
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


def cost_ratios(steps: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """c = T_draft / T_target per (draft, target) pair and mode, with the ratios parameters, weight bytes and the
    roofline floors suggest.

    The interval on c is the ratio of the two timings' interquartile ends (draft p25/target p75 … draft p75/
    target p25): a conservative band, not a confidence interval."""
    cols = [
        "draft",
        "target",
        "mode",
        "draft_ms",
        "target_ms",
        "c",
        "c_low",
        "c_high",
        "target_over_draft",
        "param_ratio",
        "bytes_ratio",
        "floor_ratio",
    ]
    if steps.empty or "median_ms" not in steps:
        return pd.DataFrame(columns=cols)
    ok = steps[steps["status"] == "ok"].set_index(["model", "mode"])
    rows = []
    for draft, target in pairs:
        for mode in steps["mode"].unique():
            if (draft, mode) not in ok.index or (target, mode) not in ok.index:
                continue
            d, t = ok.loc[(draft, mode)], ok.loc[(target, mode)]
            c = d.median_ms / t.median_ms
            rows.append(
                dict(
                    draft=draft,
                    target=target,
                    mode=mode,
                    draft_ms=d.median_ms,
                    target_ms=t.median_ms,
                    c=c,
                    c_low=d.p25_ms / t.p75_ms,
                    c_high=d.p75_ms / t.p25_ms,
                    target_over_draft=1 / c,
                    param_ratio=t.params / d.params,
                    bytes_ratio=t.weight_bytes / d.weight_bytes,
                    # what the steps would cost at their roofline floors (memory-bound: bytes read)
                    floor_ratio=t.floor_ms / d.floor_ms if "floor_ms" in t else float("nan"),
                )
            )
    return pd.DataFrame(rows, columns=cols)


CONTROLLED_COLUMNS = [
    "target",
    "draft",
    "alpha",
    "gamma",
    "batch",
    "tokens_per_s_plain",
    "tokens_per_s_spec",
    "speedup",
    "predicted_speedup",
    "c",
    # spreads and diagnostics
    "speedup_low",
    "speedup_high",
    "tokens_per_s_plain_low",
    "tokens_per_s_plain_high",
    "c_low",
    "c_high",
    "repeats",
    "alpha_realised",
    "prediction_error_pct",
    "verify_over_step",
    "loop_overhead_pct",
    "agreement",
    "host_syncs_per_round",
]


def _controlled_point(grp: pd.DataFrame, plain: pd.DataFrame, g: int, a: float) -> dict:
    """One (pair, batch, γ, α): medians over repeats with min–max spreads, c and the prediction."""
    tp_plain, tp_lo, tp_hi = _spread(plain.tokens_per_s.to_numpy())
    step_ms = float(np.median(1e3 * plain.seconds / plain.steps))  # one plain target step of the whole batch
    c_rep = (grp.draft_ms / grp.draft_steps).to_numpy() / step_ms
    c, c_lo, c_hi = _spread(c_rep)
    sp, sp_lo, sp_hi = _spread(grp.tokens_per_s.to_numpy() / tp_plain)
    pred = float(leviathan.improvement(a, g, c))
    device_ms = grp.draft_ms.sum() + grp.verify_ms.sum()
    return dict(
        alpha=a,
        gamma=g,
        tokens_per_s_plain=tp_plain,
        tokens_per_s_spec=float(np.median(grp.tokens_per_s)),
        speedup=sp,
        predicted_speedup=pred,
        c=c,
        speedup_low=sp_lo,
        speedup_high=sp_hi,
        tokens_per_s_plain_low=tp_lo,
        tokens_per_s_plain_high=tp_hi,
        c_low=c_lo,
        c_high=c_hi,
        repeats=len(grp),
        alpha_realised=leviathan.alpha_mle(int(grp.accepted.sum()), int(grp.rejections.sum())),
        prediction_error_pct=100 * (pred - sp) / sp,
        verify_over_step=float((grp.verify_ms / grp.rounds).median() / step_ms),
        loop_overhead_pct=float(100 * (1 - device_ms / (1e3 * grp.seconds.sum()))),
        agreement=float(grp.agreed.sum() / grp.seq_rounds.sum()),
        host_syncs_per_round=int(grp.host_syncs_per_round.max()),
    )


def controlled_table(raw: pd.DataFrame) -> pd.DataFrame:
    """``controlled_acceptance.csv``: one row per (target, draft, α, γ, batch) that ran (``CONTROLLED_COLUMNS``).

    speedup: median over repeats of the speculative tokens/s over the median plain tokens/s (spread: min–max);
    c: a draft step (device time inside the loop, its γ steps of a round over γ) over a plain target step of
    the same batch; predicted_speedup: Leviathan's from the α set, γ and that c; verify_over_step: the verify
    step over a plain step (the formula takes it as 1); loop_overhead_pct: the share of wall time outside the
    draft and verify phases (host planning, the readback); agreement: the share of sequence-rounds where the
    target's own acceptance on the device equalled the controlled one (1 in exact arithmetic)."""
    if raw.empty or "tokens_per_s" not in raw:
        return pd.DataFrame(columns=CONTROLLED_COLUMNS)
    ok = raw[raw.status == "ok"]
    plain = ok[ok.method == "plain"]
    rows = []
    for (t, d, b, g, a), grp in ok[ok.method == "speculative"].groupby(
        ["target", "draft", "batch", "gamma", "alpha"], sort=False
    ):
        base = plain[(plain.target == t) & (plain.draft == d) & (plain.batch == b)]
        if base.empty:
            continue
        rows.append(dict(target=t, draft=d, batch=int(b)) | _controlled_point(grp, base, int(g), float(a)))
    return pd.DataFrame(rows, columns=CONTROLLED_COLUMNS)


def best_gamma_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, batch, α): the γ with the highest measured speedup."""
    if table.empty:
        return table
    idx = table.groupby(["target", "draft", "batch", "alpha"]).speedup.idxmax()
    return table.loc[idx].reset_index(drop=True)


def break_even_alpha(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, batch): the α above which speculation pays at its best γ: the lowest α whose best speedup is above
    1, linearly interpolated from the α below it (``alpha_pays`` is NaN if no α pays, the lowest α if all do)."""
    rows = []
    for (t, d, b), grp in best_gamma_rows(table).groupby(["target", "draft", "batch"], sort=False):
        s = grp.sort_values("alpha")
        alphas, speed = s.alpha.to_numpy(), s.speedup.to_numpy()
        pays = np.flatnonzero(speed > 1)
        if len(pays) == 0:
            at = float("nan")
        elif pays[0] == 0:
            at = float(alphas[0])
        else:
            i = pays[0]
            at = float(np.interp(1.0, speed[i - 1 : i + 1], alphas[i - 1 : i + 1]))
        rows.append(
            dict(
                target=t,
                draft=d,
                batch=int(b),
                alpha_pays=at,
                all_pay=bool(len(pays) == len(s)),
                alpha_max=float(alphas[-1]),
                best_speedup=float(s.speedup.max()),
                c=float(s.c.median()),
            )
        )
    return pd.DataFrame(rows)


LOOKUP_COLUMNS = [
    "target",
    "batch",
    "gamma",
    "tokens_per_s_plain",
    "tokens_per_s_lookup",
    "speedup",
    "speedup_low",
    "speedup_high",
    "tokens_per_s_plain_low",
    "tokens_per_s_plain_high",
    "alpha_realised",  # per-proposal acceptance, a search that ran out counting as a miss (real_acceptance's α)
    "proposed_share",  # drafts proposed over drafts asked: how often the search found something to copy
    "tokens_per_round",  # tokens per sequence-round: what one verify of a sequence bought
    "propose_ms_per_round",  # the host's search, per round of the whole batch
    "same_tokens",  # share of repeats whose tokens equal plain decoding's (1 in float32; bfloat16 may differ)
    "host_syncs_per_round",  # the most host syncs a round made in the warm-up (``HostSyncs``); the design says 1
    "repeats",
]


def _lookup_point(grp: pd.DataFrame, plain: pd.DataFrame) -> dict:
    """One (target, batch, γ): medians over repeats with min–max spreads."""
    tp_plain, tp_lo, tp_hi = _spread((plain.tokens / plain.seconds).to_numpy())
    tps = (grp.tokens / grp.seconds).to_numpy()
    sp, sp_lo, sp_hi = _spread(tps / tp_plain)
    return dict(
        tokens_per_s_plain=tp_plain,
        tokens_per_s_lookup=float(np.median(tps)),
        speedup=sp,
        speedup_low=sp_lo,
        speedup_high=sp_hi,
        tokens_per_s_plain_low=tp_lo,
        tokens_per_s_plain_high=tp_hi,
        alpha_realised=leviathan.alpha_mle(int(grp.accepted.sum()), int(grp.rejections.sum())),
        proposed_share=float(grp.proposed.sum() / grp.asked.sum()),
        tokens_per_round=float(grp.tokens.sum() / grp.seq_rounds.sum()),
        propose_ms_per_round=float(grp.propose_ms.sum() / grp.rounds.sum()),
        same_tokens=float(grp.same_tokens.mean()),
        host_syncs_per_round=int(grp.host_syncs.max()),
        repeats=len(grp),
    )


def lookup_table(raw: pd.DataFrame) -> pd.DataFrame:
    """``lookup_speed.csv``: one row per (target, batch, γ) (``LOOKUP_COLUMNS``). speedup: the median over repeats
    of lookup's tokens/s over the median plain tokens/s of the same batch (spread: min–max)."""
    if raw.empty or "method" not in raw:
        return pd.DataFrame(columns=LOOKUP_COLUMNS)
    plain = raw[raw.method == "plain"]
    rows = []
    for (t, b, g), grp in raw[raw.method == "lookup"].groupby(["target", "batch", "gamma"], sort=False):
        base = plain[(plain.target == t) & (plain.batch == b)]
        if not base.empty:
            rows.append(dict(target=t, batch=int(b), gamma=int(g)) | _lookup_point(grp, base))
    return pd.DataFrame(rows, columns=LOOKUP_COLUMNS)
