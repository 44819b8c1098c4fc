"""The seed's claims F5.1–F5.3, computed from the sweeps, each with a verdict by a stated rule.

Rule for the two numeric claims: the verdict is ``holds`` when the claim's direction holds and each
measured value is within a factor of ``AGREEMENT`` (2) of the RTX 2070's, ``changes`` when the direction
holds but a value is further off, ``fails`` when the direction does not hold. F5.3 is qualitative:
``holds`` when every kernel spread exceeds every architecture spread, ``changes`` when only their medians
are ordered that way, ``fails`` otherwise.

"Configuration" below means one (model heads, head dim) pair of the prefill sweep; times are medians (ms).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from servelab.studies.common.claim_finding import claim_finding
from servelab.studies.common.findings import Finding
from servelab.studies.s05_attention.params import SEED_COMPARISON_LENGTH, SEED_GROWTH

AGREEMENT = 2.0
SEED_SPEEDUP = 7.64  # F5.1, RTX 2070: naive / SDPA default at 2,048 tokens
SEED_MEMORY_GROWTH = {"naive": 25.0, "sdpa_default": 2.4}  # F5.2, RTX 2070: ×, for 32× longer
CLAIMS = {
    "F5.1": "SDPA's default is 7.64× faster than naive attention at 2,048 tokens",
    "F5.2": "for 32× longer sequences, peak memory grows 25× with naive attention and 2.4× with SDPA",
    "F5.3": "at long sequences the kernel choice matters more than the model architecture",
}
CONFIG = ["arch", "head_dim"]
# F5.3 compares kernels: SDPA's default dispatch duplicates one of the forced backends, and repeating K/V
# heads is a GQA strategy, not a kernel, so neither enters the kernel comparison
KERNELS = ("naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "flex")


def _within(measured: float, seed: float) -> bool:
    return 1 / AGREEMENT <= measured / seed <= AGREEMENT


def config_label(arch: str, head_dim: int) -> str:
    return f"{arch}, D={head_dim}"


def with_config(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``config`` column: each row's ``config_label``."""
    return df.assign(config=[config_label(a, d) for a, d in zip(df["arch"], df["head_dim"], strict=True)])


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].eq("ok")]


def tested_on(df: pd.DataFrame, primary: tuple[str, int] | None = None) -> str:
    """The head layouts (query heads, K/V heads, head dim) and dtypes of the measured rows a verdict rests on:
    attention alone, on random N(0, 1) inputs (its time depends on shapes, not on trained weights)."""
    ok = _ok(df)
    if primary is not None:
        ok = ok[(ok["arch"] == primary[0]) & (ok["head_dim"] == primary[1])]
    cfg = ok[["arch", "heads", "kv_heads", "head_dim"]].drop_duplicates().sort_values(["arch", "head_dim"])
    layouts = "; ".join(f"{r.arch} heads ({r.heads}q/{r.kv_heads}kv, D={r.head_dim})" for r in cfg.itertuples())
    dtypes = ", ".join(sorted(ok["dtype"].unique())) if "dtype" in ok else "?"
    return f"attention alone at {layouts or 'no measured shape'}; random N(0, 1) inputs, {dtypes}"


# ---- F5.1 -------------------------------------------------------------------------------------------
def speedup_vs_naive(prefill: pd.DataFrame, variant: str = "sdpa_default") -> pd.DataFrame:
    """naive time / ``variant`` time per configuration and length, where both ran."""
    t = _ok(prefill).pivot_table(index=CONFIG + ["q_len"], columns="variant", values="median_ms")
    if "naive" not in t or variant not in t:
        return pd.DataFrame(columns=CONFIG + ["q_len", "speedup"])
    out = (t["naive"] / t[variant]).rename("speedup").dropna().reset_index()
    return out


def f51(prefill: pd.DataFrame, primary: tuple[str, int], length: int = SEED_COMPARISON_LENGTH) -> Finding:
    """F5.1 at the seed's 2,048 tokens for the primary configuration (the range over all in the note)."""
    sp = speedup_vs_naive(prefill)
    at = sp[sp["q_len"].eq(length)]
    mine = at[(at["arch"] == primary[0]) & (at["head_dim"] == primary[1])]
    if mine.empty:
        raise ValueError(f"F5.1 needs naive and sdpa_default at {length} tokens for {primary}")
    x = float(mine["speedup"].iloc[0])
    verdict = "fails" if x <= 1 else ("holds" if _within(x, SEED_SPEEDUP) else "changes")
    backend = _ok(prefill).query(
        "variant == 'sdpa_default' and q_len == @length and arch == @primary[0] and head_dim == @primary[1]"
    )["backend"]
    note = (
        f"causal prefill, batch 1, {length:,} tokens, {config_label(*primary)}; SDPA's default ran "
        f"{backend.iloc[0] if len(backend) else '?'}; over all {len(at)} configurations "
        f"{at['speedup'].min():.1f}–{at['speedup'].max():.1f}×; rule: holds within {AGREEMENT:g}× of the seed"
    )
    return claim_finding(
        CLAIMS,
        "F5.1",
        seed_value=str(SEED_SPEEDUP),
        measured_value=str(round(x, 2)),
        unit="×",
        verdict=verdict,
        note=note,
        tested_on=tested_on(prefill[prefill["q_len"].eq(length)], primary),
        headline=x,
        headline_unit=f"× naive / SDPA default at {length:,} tokens (holds within {AGREEMENT:g}× of {SEED_SPEEDUP})",
    )


# ---- F5.2 -------------------------------------------------------------------------------------------
def memory_growth(prefill: pd.DataFrame, pairs: list[list[int]]) -> pd.DataFrame:
    """Peak-memory growth from L to 32·L per configuration and variant, both definitions:
    ``growth_incl_inputs`` (peak allocated during the call, Q/K/V included) and ``growth_working``
    (beyond the inputs: intermediates, workspace, output)."""
    ok = _ok(prefill).set_index(CONFIG + ["variant", "q_len"])
    rows = []
    for short, long in pairs:
        for key in ok.index.droplevel("q_len").unique():
            try:
                a, b = ok.loc[key + (short,)], ok.loc[key + (long,)]
            except KeyError:
                continue
            rows.append(
                dict(
                    zip(CONFIG + ["variant"], key, strict=True),
                    short=short,
                    long=long,
                    peak_short_bytes=a["peak_mem_incl_inputs_bytes"],
                    peak_long_bytes=b["peak_mem_incl_inputs_bytes"],
                    growth_incl_inputs=b["peak_mem_incl_inputs_bytes"] / a["peak_mem_incl_inputs_bytes"],
                    growth_working=b["peak_mem_bytes"] / a["peak_mem_bytes"],
                )
            )
    return pd.DataFrame(rows)


def growth_exponents(prefill: pd.DataFrame) -> pd.DataFrame:
    """Slope of log(peak working memory) against log(length) per configuration and variant: ≈ 2 for a
    kernel that materialises the L×L scores, ≈ 1 for one that streams them (scipy linregress)."""
    rows = []
    for key, g in _ok(prefill).dropna(subset=["peak_mem_bytes"]).groupby(CONFIG + ["variant"]):
        g = g[g["peak_mem_bytes"] > 0]
        if g["q_len"].nunique() >= 3:
            fit = stats.linregress(np.log(g["q_len"]), np.log(g["peak_mem_bytes"]))
            rows.append(
                dict(
                    zip(CONFIG + ["variant"], key, strict=True),
                    exponent=fit.slope,
                    r2=fit.rvalue**2,
                    lengths=f"{g['q_len'].min()}–{g['q_len'].max()}",
                )
            )
    return pd.DataFrame(rows)


def f52(
    growth: pd.DataFrame,
    primary: tuple[str, int],
    method: str = "max_memory_allocated during one call",
    shapes: str = "",
) -> Finding:
    """F5.2 on the first (L, 32·L) pair, primary configuration, peak memory including the inputs
    (``method`` names how the peak was measured, for the note; ``shapes``: what it was tested on)."""
    g = growth[(growth["arch"] == primary[0]) & (growth["head_dim"] == primary[1])]
    if g.empty:
        raise ValueError(f"F5.2 needs peak memory at L and {SEED_GROWTH}·L for {primary}")
    first = g[g["short"].eq(g["short"].min())].set_index("variant")
    if not {"naive", "sdpa_default"} <= set(first.index):
        raise ValueError("F5.2 needs both naive and sdpa_default at both lengths of the growth pair")
    naive, sdpa = first.loc["naive", "growth_incl_inputs"], first.loc["sdpa_default", "growth_incl_inputs"]
    if naive <= sdpa:
        verdict = "fails"
    elif _within(naive, SEED_MEMORY_GROWTH["naive"]) and _within(sdpa, SEED_MEMORY_GROWTH["sdpa_default"]):
        verdict = "holds"
    else:
        verdict = "changes"
    short, long = int(first["short"].iloc[0]), int(first["long"].iloc[0])
    w = first["growth_working"]
    note = (
        f"{short:,}→{long:,} tokens, {config_label(*primary)}; peak = {method}, "
        f"Q/K/V included (beyond the inputs: naive {w['naive']:.0f}×, SDPA {w['sdpa_default']:.1f}×); "
        f"rule: holds if both within {AGREEMENT:g}× of the seed"
    )
    return claim_finding(
        CLAIMS,
        "F5.2",
        seed_value="25× naive, 2.4× SDPA",
        measured_value=f"{naive:.0f}× naive, {sdpa:.1f}× SDPA",
        unit="× peak memory",
        verdict=verdict,
        note=note,
        tested_on=shapes,
        headline=float(naive),
        headline_unit=f"× naive attention's peak-memory growth for {SEED_GROWTH}× longer (holds within "
        f"{AGREEMENT:g}× of {SEED_MEMORY_GROWTH['naive']:g}, SDPA's within {AGREEMENT:g}× of "
        f"{SEED_MEMORY_GROWTH['sdpa_default']:g})",
    )


# ---- F5.3 -------------------------------------------------------------------------------------------
def comparison_length(df: pd.DataFrame, length_col: str = "q_len", start: int = SEED_COMPARISON_LENGTH) -> int:
    """The longest length (≥ ``start``, or the shortest swept if none is) at which every kernel that ran on
    all configurations at ``start`` still ran on all of them: the longest like-for-like comparison."""
    ok = _ok(df)
    n_cfg = df[CONFIG].drop_duplicates().shape[0]

    def everywhere(length):
        at = ok[ok[length_col].eq(length) & ok["variant"].isin(KERNELS)]
        counts = at.groupby("variant")[CONFIG].apply(lambda g: len(g.drop_duplicates()))
        return set(counts[counts == n_cfg].index)

    lengths = sorted(ok[length_col].unique())
    if start not in lengths:
        start = lengths[0] if lengths else start
    base = everywhere(start)
    if len(base) < 2:
        raise ValueError(f"F5.3 needs at least two kernels measured on every configuration at {length_col}={start}")
    return int(max(L for L in lengths if start <= L and base <= everywhere(L)))


def spreads(
    prefill: pd.DataFrame,
    decode: pd.DataFrame | None = None,
    decode_batch: int = 1,
    start: int = SEED_COMPARISON_LENGTH,
) -> pd.DataFrame:
    """Slowest / fastest time across kernels for each configuration, and across configurations for each
    kernel (kernels that ran on all of them), at the longest like-for-like length: causal prefill, and,
    given ``decode``, decode at ``decode_batch`` sequences (where the K/V head count sets the bytes)."""
    parts = [_spread(prefill, "q_len", "prefill", start)]
    if decode is not None:
        d = decode[decode["batch"].eq(decode_batch)]
        if len(_ok(d)):
            parts.append(_spread(d, "kv_len", "decode", start=int(_ok(d)["kv_len"].min())).assign(batch=decode_batch))
    return pd.concat(parts, ignore_index=True)


def _spread(df: pd.DataFrame, length_col: str, regime: str, start: int = SEED_COMPARISON_LENGTH) -> pd.DataFrame:
    length = comparison_length(df, length_col, start)
    ok = _ok(df)
    at = with_config(ok[ok[length_col].eq(length) & ok["variant"].isin(KERNELS)])
    t = at.pivot_table(index="config", columns="variant", values="median_ms").dropna(axis=1)

    def row(comparison: str, fixed: str, times: pd.Series) -> dict:
        return dict(
            regime=regime,
            length=length,
            comparison=comparison,
            fixed=fixed,
            spread=times.max() / times.min(),
            slowest=times.idxmax(),
            fastest=times.idxmin(),
        )

    rows = [row("across kernels, fixed architecture", cfg, r) for cfg, r in t.iterrows()]
    rows += [row("across architectures, fixed kernel", var, c) for var, c in t.items()]
    return pd.DataFrame(rows)


def _kernel_and_arch_spreads(spread: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    comparison = spread["comparison"].str
    return (
        spread[comparison.startswith("across kernels")]["spread"],
        spread[comparison.startswith("across architectures")]["spread"],
    )


def f53(spread: pd.DataFrame, shapes: str = "") -> Finding:
    """F5.3 judged on causal prefill (the seed's setting); the decode comparison, if present, goes in the note
    (``shapes``: what it was tested on)."""
    pre = spread[spread["regime"].eq("prefill")] if "regime" in spread else spread
    k, a = _kernel_and_arch_spreads(pre)
    if k.empty or a.empty:
        raise ValueError("F5.3 needs kernel and architecture spreads")
    verdict = "holds" if k.min() > a.max() else ("changes" if k.median() > a.median() else "fails")
    L = int(pre["length"].iloc[0])
    kernels = ", ".join(pre.loc[a.index, "fixed"].astype(str)) if "fixed" in pre else f"{len(a)} kernels"
    note = (
        f"causal prefill at {L:,} tokens, the longest length where every kernel ran on every configuration "
        f"({len(k)} configurations; the {len(a)} kernels compared: {kernels}); rule: holds if every kernel spread "
        "exceeds every architecture spread"
    )
    dec = spread[spread["regime"].eq("decode")] if "regime" in spread else spread.iloc[:0]
    if len(dec):
        dk, da = _kernel_and_arch_spreads(dec)
        note += (
            f"; decode (batch {int(dec['batch'].iloc[0])}, KV {int(dec['length'].iloc[0]):,}): kernels "
            f"{dk.min():.1f}–{dk.max():.1f}×, architectures {da.min():.1f}–{da.max():.1f}×"
        )
    return claim_finding(
        CLAIMS,
        "F5.3",
        seed_value="kernel > architecture",
        measured_value=f"kernels {k.min():.1f}–{k.max():.1f}×, architectures {a.min():.1f}–{a.max():.1f}×",
        unit="× slowest/fastest",
        verdict=verdict,
        note=note,
        tested_on=shapes,
        headline=float(k.min() / a.max()),
        headline_unit="× the smallest kernel spread over the largest architecture spread (holds above 1)",
    )


def findings(
    prefill: pd.DataFrame,
    primary: tuple[str, int],
    pairs: list[list[int]],
    decode: pd.DataFrame | None = None,
    length: int = SEED_COMPARISON_LENGTH,
    decode_batch: int = 1,
    memory_method: str = "max_memory_allocated during one call",
) -> tuple[list[Finding], list[str]]:
    """The F5.1–F5.3 findings that the data supports, and a message for each that it does not
    (``length``: the comparison point, the seed's 2,048 tokens unless a test says otherwise)."""
    judges = (
        lambda: f51(prefill, primary, length),
        lambda: f52(memory_growth(prefill, pairs), primary, memory_method, tested_on(prefill, primary)),
        lambda: f53(spreads(prefill, decode, decode_batch, start=length), tested_on(prefill)),
    )
    out, problems = [], []
    for judge in judges:
        try:
            out.append(judge())
        except ValueError as e:
            problems.append(str(e))
    return out, problems
