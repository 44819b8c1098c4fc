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

from servelab.speculative import leviathan


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


def _groups(df: pd.DataFrame, keys: list[str]):
    """(key tuple, row positions) per group of ``df`` by ``keys``, in first-seen order (numpy from here on: the
    tables are small and pandas' per-group overhead dominated the page's render time)."""
    if df.empty:
        return
    codes = df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    first = {}
    for i, k in enumerate(codes):
        first.setdefault(int(k), i)
    cols = [df[k].to_numpy() for k in keys]
    for k, i in first.items():
        yield tuple(c[i] for c in cols), np.flatnonzero(codes == k)


def speedup_table(sweep: pd.DataFrame, c_by_pair: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Per (target, draft, γ, temperature): α (MLE) and acceptance rate, tokens per round, the measured speedup
    (median over prompts of the target-alone time over the speculative time, with a bootstrap CI), and the
    Leviathan prediction from the measured α and ``c_by_pair[(draft, target)]``, with its error."""
    if sweep.empty or "ms" not in sweep:
        return pd.DataFrame(columns=SPEEDUP_COLUMNS)
    ok = sweep[sweep["status"] == "ok"]
    on = ["target", "temperature", "prompt"]
    base_cols = ["ms", "ms_per_token"] + (["output"] if "output" in ok else [])
    base = ok[ok.method == "autoregressive"].drop_duplicates(on)[on + base_cols]
    chained = ok[ok.method == "autoregressive_chained"].drop_duplicates(on)[on + ["ms"]]
    spec = ok[ok.method == "speculative"]
    # each speculative row beside its prompt's plain (and chained) run: the rows without a plain run drop out
    m = spec.merge(base.rename(columns={c: f"base_{c}" for c in base_cols}), on=on, how="inner", sort=False)
    m = m.merge(chained.rename(columns={"ms": "chained_ms"}), on=on, how="left", sort=False)
    col = {c: m[c].to_numpy() for c in m.columns}
    rows = []
    for (tg, d, g, T), i in _groups(m, ["target", "draft", "gamma", "temperature"]):
        ms, base_ms = col["ms"][i].astype(float), col["base_ms"][i].astype(float)
        sp, lo, hi = _median_ci(base_ms / ms)
        acc, rej = col["accepted"][i].sum(), col["rejections"][i].sum()
        prop, rounds = col["proposed"][i].sum(), col["rounds"][i].sum()
        alpha = leviathan.alpha_mle(int(acc), int(rej))
        mean_gamma = prop / rounds
        c = c_by_pair.get((d, tg), float("nan"))
        pred = (
            float(leviathan.improvement(alpha, mean_gamma, c))
            if np.isfinite(c) and np.isfinite(alpha)
            else float("nan")
        )
        exact = float("nan")
        if T == 0 and "output" in col:  # the legacy run kept no outputs
            exact = float(np.mean(col["base_output"][i] == col["output"][i]))
        total_ms = ms.sum()
        ch = col["chained_ms"][i].astype(float)
        has = np.isfinite(ch)
        vs_chained = _median_ci(ch[has] / ms[has]) if has.any() else (float("nan"),) * 3
        # c as the loop itself ran it: a draft step's time over a plain decode step's, the timed rounds' time over
        # their steps (draft_steps); runs from before that column divide by every proposed draft
        base_step = float(np.median(col["base_ms_per_token"][i]))
        steps = col["draft_steps"][i].astype(float).sum() if "draft_steps" in col else float("nan")
        c_loop = (col["draft_ms"][i].sum() / (steps if steps > 0 else prop)) / base_step
        pred_loop = float(leviathan.improvement(alpha, mean_gamma, c_loop)) if np.isfinite(alpha) else float("nan")
        rows.append(
            dict(
                target=tg,
                draft=d,
                gamma=g,
                temperature=T,
                prompts=len(i),
                alpha=alpha,
                acceptance_rate=acc / prop,
                mean_gamma=mean_gamma,
                tokens_per_round=col["tokens"][i].sum() / rounds,
                ms_per_token=float(np.median(col["ms_per_token"][i])),
                baseline_ms_per_token=base_step,
                speedup=sp,
                speedup_ci_low=lo,
                speedup_ci_high=hi,
                c=c,
                predicted_speedup=pred,
                prediction_error_pct=100 * (pred - sp) / sp,
                c_in_loop=c_loop,
                predicted_speedup_in_loop=pred_loop,
                prediction_error_in_loop_pct=100 * (pred_loop - sp) / sp,
                rollback_share_pct=100 * col["rollback_ms"][i].sum() / total_ms,
                draft_share_pct=100 * col["draft_ms"][i].sum() / total_ms,
                verify_share_pct=100 * col["verify_ms"][i].sum() / total_ms,
                greedy_exact_match=exact,
                speedup_vs_chained=vs_chained[0],
                speedup_vs_chained_ci_low=vs_chained[1],
                speedup_vs_chained_ci_high=vs_chained[2],
            )
        )
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def pays_map(alphas: np.ndarray, cs: np.ndarray, max_gamma: int = 8) -> pd.DataFrame:
    """The best predicted improvement over γ ≤ ``max_gamma`` on a grid of α × c (the map of where speculation pays):
    ``leviathan.best_gamma`` at every point, as one array operation."""
    a, c, g = np.meshgrid(np.asarray(alphas, float), np.asarray(cs, float), np.arange(1, max_gamma + 1), indexing="ij")
    imp = np.asarray(leviathan.improvement(a, g, c))
    best = np.argmax(imp, axis=-1)  # the first γ of the highest improvement, as best_gamma picks it
    return pd.DataFrame(
        dict(
            alpha=a[..., 0].ravel(),
            c=c[..., 0].ravel(),
            best_gamma=(best + 1).ravel().astype(int),
            improvement=np.take_along_axis(imp, best[..., None], axis=-1).ravel(),
        )
    )


def cost_ratios(steps: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """c = T_draft / T_target per (draft, target) pair and mode, with the ratios parameters, weight bytes and the
    roofline floors suggest. Where the steps were timed in pairs, c is the median over pairs (``c_paired``), and
    ``draft_ms``, ``target_ms`` each model's own median.

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
    ok = steps[steps["status"] == "ok"]
    paired = "c_paired" in ok
    rows = []
    for draft, target in pairs:
        # steps timed in pairs (``cost_ratio.paired_step_costs``, the costs part) are the rows of that pair; the rest
        # were timed alone (older runs, and the real part's step costs, which a page reads beside the paired shape
        # rows: keeping only paired rows there lost every real pair's c)
        mine = ok[ok.paired_with.isin([draft, target]) | ok.paired_with.isna()] if paired else ok
        mine = mine.drop_duplicates(["model", "mode"]).set_index(["model", "mode"])
        for mode in steps["mode"].unique():
            if (draft, mode) not in mine.index or (target, mode) not in mine.index:
                continue
            d, t = mine.loc[(draft, mode)], mine.loc[(target, mode)]
            # paired: the median over pairs of the two steps' ratio, which a drift between the models cannot split
            c = d.c_paired if paired and np.isfinite(d.c_paired) else d.median_ms / t.median_ms
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
    # verify steps the batch ran over those its mean request needed (1 at batch 1): a closed batch waits for its
    # slowest request, whose draws kept fewest, which Leviathan's formula (a mean request's) does not price
    "batch_tail",
]


def controlled_table(raw: pd.DataFrame) -> pd.DataFrame:
    """``controlled_acceptance.csv``: one row per (target, draft, α, γ, batch) that ran (``CONTROLLED_COLUMNS``):
    medians over repeats with min–max spreads.

    speedup: median over repeats of the speculative tokens/s over the median plain tokens/s (spread: min–max);
    c: a draft step (device time inside the loop, its γ steps of a round over γ) over a plain target step of
    the same batch; predicted_speedup: Leviathan's from the α set, γ and that c; verify_over_step: the verify
    step over a plain step (the formula takes it as 1); loop_overhead_pct: the share of wall time outside the
    draft and verify phases (host planning, the readback); agreement: the share of sequence-rounds where the
    target's own acceptance on the device equalled the controlled one (1 in exact arithmetic)."""
    if raw.empty or "tokens_per_s" not in raw:
        return pd.DataFrame(columns=CONTROLLED_COLUMNS)
    ok = raw[raw.status == "ok"]
    pair = ["target", "draft", "batch"]
    plain, p = {}, ok[ok.method == "plain"]
    for key, i in _groups(p, pair):
        tps = p.tokens_per_s.to_numpy()[i].astype(float)
        steps = (1e3 * p.seconds.to_numpy()[i] / p.steps.to_numpy()[i]).astype(float)
        plain[key] = (*_spread(tps), float(np.median(steps)))  # one plain target step of the whole batch
    spec = ok[ok.method == "speculative"]
    col = {c: spec[c].to_numpy() for c in spec.columns}
    rows = []
    for (t, d, b, g, a), i in _groups(spec, [*pair, "gamma", "alpha"]):
        if (t, d, b) not in plain:
            continue
        tp_plain, tp_lo, tp_hi, step_ms = plain[(t, d, b)]
        c, c_lo, c_hi = _spread((col["draft_ms"][i] / col["draft_steps"][i]).astype(float) / step_ms)
        sp, sp_lo, sp_hi = _spread(col["tokens_per_s"][i].astype(float) / tp_plain)
        a, g = float(a), int(g)
        pred = float(leviathan.improvement(a, g, c))
        # the device phases inside ``seconds``: the draft rounds (rows of one earlier commit held their first round
        # apart, in ``draft_first_ms``; today's hold every round in ``draft_ms`` and 0 there), the verify steps
        first = col["draft_first_ms"][i].astype(float) if "draft_first_ms" in col else np.zeros(len(i))
        device_ms = col["draft_ms"][i].sum() + np.nan_to_num(first).sum() + col["verify_ms"][i].sum()
        rows.append(
            dict(
                target=t,
                draft=d,
                batch=int(b),
                alpha=a,
                gamma=g,
                tokens_per_s_plain=tp_plain,
                tokens_per_s_spec=float(np.median(col["tokens_per_s"][i])),
                speedup=sp,
                predicted_speedup=pred,
                c=c,
                speedup_low=sp_lo,
                speedup_high=sp_hi,
                tokens_per_s_plain_low=tp_lo,
                tokens_per_s_plain_high=tp_hi,
                c_low=c_lo,
                c_high=c_hi,
                repeats=len(i),
                alpha_realised=leviathan.alpha_mle(int(col["accepted"][i].sum()), int(col["rejections"][i].sum())),
                prediction_error_pct=100 * (pred - sp) / sp,
                verify_over_step=float(np.median(col["verify_ms"][i] / col["rounds"][i]) / step_ms),
                loop_overhead_pct=float(100 * (1 - device_ms / (1e3 * col["seconds"][i].sum()))),
                agreement=float(col["agreed"][i].sum() / col["seq_rounds"][i].sum()),
                host_syncs_per_round=int(col["host_syncs_per_round"][i].max()),
                batch_tail=float(np.median(col["rounds"][i] * int(b) / col["seq_rounds"][i])),
            )
        )
    return pd.DataFrame(rows, columns=CONTROLLED_COLUMNS)


def best_gamma_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, batch, α): the γ with the highest measured speedup."""
    if table.empty:
        return table
    idx = table.groupby(["target", "draft", "batch", "alpha"]).speedup.idxmax()
    return table.loc[idx].reset_index(drop=True)


def break_even_alpha(table: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, batch): the α above which speculation pays at its best γ: the lowest α whose best speedup is above
    1, linearly interpolated from the α below it (``alpha_pays`` is NaN if no α pays, the lowest α if all do).

    ``c`` is the loop's cost ratio over every point of the pair and batch (every γ and α), the statistic the
    seed-shapes page and F3.3's note use too: taken over the best-γ rows alone it read 0.610 where that page read
    0.593 for the same runs, both labelled "c in the loop"."""
    if table.empty:
        return pd.DataFrame()
    keys = ["target", "draft", "batch"]
    c_all = table.groupby(keys, sort=False).c.median()
    rows = []
    for (t, d, b), grp in best_gamma_rows(table).groupby(keys, sort=False):
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
                c=float(c_all.loc[(t, d, b)]),
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
    # acceptance given a proposal: a round whose search found nothing proposed nothing and is not counted here
    # (``proposed_share`` says how often one did), where real_acceptance's lookup α counts it as a miss
    "alpha_realised",
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
