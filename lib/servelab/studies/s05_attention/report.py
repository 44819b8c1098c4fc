"""Study 5's reporting path: everything its page shows, computed from the runs' files (``report``), and the page
text: takeaways and compact tables (about a dozen rows at most; the full tables are the runs' CSVs).

Each run's raw rows get their roofline columns from that run's own measured ceilings (``derived.add_roofline``);
each repeat's verdicts come from its own rows; tables and figures show each point's median over repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from servelab.measure.ceilings import Ceilings
from servelab.measure.roofline import Roofline
from servelab.studies.common.findings import Finding, not_measured, seed_value
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.study_page import StudyPage
from servelab.studies.s05_attention import recommend, tables, verdicts
from servelab.studies.s05_attention.derived import add_roofline
from servelab.studies.s05_attention.params import SEED_COMPARISON_LENGTH
from servelab.studies.s05_attention.shapes import Architecture

STUDY = "05_attention"
SHAPE = ["arch", "heads", "kv_heads", "head_dim", "batch", "q_len", "kv_len", "mask", "mask_label", "variant"]
MEMORY_METHOD = {"cuda": "the CUDA allocator's peak during one call"}
CPU_MEMORY_METHOD = "bytes of live tensors during one call (CPU tensor tracker)"


@dataclass
class Study5Page(StudyPage):
    problems: list[str] = field(default_factory=list)  # claims some repeat's data could not judge, and why
    P: dict = field(default_factory=dict)  # the first run's parameters
    ceilings: Ceilings | None = None  # the first run's
    dispatch: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefill: pd.DataFrame = field(default_factory=pd.DataFrame)  # median over repeats, roofline columns added
    decode: pd.DataFrame = field(default_factory=pd.DataFrame)
    masks: pd.DataFrame = field(default_factory=pd.DataFrame)
    speedups: pd.DataFrame = field(default_factory=pd.DataFrame)
    growth: pd.DataFrame = field(default_factory=pd.DataFrame)
    exponents: pd.DataFrame = field(default_factory=pd.DataFrame)
    gqa: pd.DataFrame = field(default_factory=pd.DataFrame)
    spread: pd.DataFrame = field(default_factory=pd.DataFrame)
    recommendations: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def kind(self) -> str:
        return str(self.runs.device.get("kind", "cpu"))

    @property
    def roof(self) -> Roofline | None:
        return Roofline.from_ceilings(self.ceilings) if self.ceilings else None

    @property
    def sdpa_order(self) -> list[str]:
        return list(self.runs.device.get("sdpa_priority") or [])


def rows(runs: RunSet, name: str) -> pd.DataFrame:
    """``<name>.csv`` of every run with ``repeat`` and ``part`` columns and the roofline columns computed against
    that run's own ceilings; an empty frame where no run wrote one (or a run recorded no ceilings)."""
    frames = []
    for r in runs.runs:
        df = r.table(name)
        ceil = r.meta.get("ceilings")
        if df.empty or not ceil or "status" not in df:
            continue
        df = add_roofline(df, Roofline.from_ceilings(Ceilings.from_dict(ceil)))
        frames.append(df.assign(repeat=r.repeat, part=r.part))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def primary(P: dict) -> tuple[str, int]:
    """F5.1 and F5.2's configuration: the first model at its own head dim, or the largest swept one."""
    model = P["models"][0]
    d = Architecture.from_model(model).head_dim
    return (model, d if d in P["head_dims"] else max(P["head_dims"]))


def memory_method(kind: str) -> str:
    return MEMORY_METHOD.get(kind, CPU_MEMORY_METHOD)


def judge(rep: RunSet) -> tuple[list[Finding], list[str]]:
    """F5.1–F5.3 by today's rules from one repeat's rows, and why any claim could not be judged."""
    P = rep.params
    prefill, decode = rows(rep, "prefill"), rows(rep, "decode")
    if prefill.empty or not P.get("models"):
        return [], ["no prefill rows in this repeat"]
    return verdicts.findings(
        prefill,
        primary(P),
        P["growth_pairs"],
        decode if not decode.empty else None,
        decode_batch=min(P["decode_batches"]),
        memory_method=memory_method(str(rep.device.get("kind", "cpu"))),
    )


def repeat_findings(rep: RunSet) -> list[Finding]:
    return judge(rep)[0]


def complete(findings: list[Finding], problems: list[str]) -> list[Finding]:
    """Every claim of the study, in the seed's order: a claim no repeat judged reads inconclusive, not judged."""
    have = {f.id: f for f in findings}
    why = "; ".join(dict.fromkeys(problems)) or "no repeat's data judged it"
    return [have.get(f.id) or not_measured(STUDY, f"not judged: {why}")[i] for i, f in enumerate(not_measured(STUDY))]


def _safe(fn, *args, **kw) -> pd.DataFrame:
    """A derived table, or an empty one where the data lacks what it needs (a deleted CSV, a sweep that failed)."""
    try:
        return fn(*args, **kw)
    except (KeyError, ValueError, TypeError):
        return pd.DataFrame()


def report(runs: RunSet) -> Study5Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    if not runs.measured:
        return Study5Page(runs, not_measured(STUDY))
    problems = [p for rep in runs.per_repeat() for p in judge(rep)[1]]
    findings = complete(runs.combined(repeat_findings), problems)
    P = runs.params
    prefill = pool_repeats(rows(runs, "prefill"), SHAPE)
    decode = pool_repeats(rows(runs, "decode"), SHAPE)
    masks = pool_repeats(rows(runs, "masks"), SHAPE)
    dispatch = runs.first("dispatch")
    page = Study5Page(runs, findings, list(dict.fromkeys(problems)), P, runs.ceiling_record, dispatch, prefill, decode,
                      masks)  # fmt: skip
    if not prefill.empty:
        page.speedups = _safe(verdicts.speedup_vs_naive, prefill)
        page.growth = _safe(verdicts.memory_growth, prefill, P.get("growth_pairs", []))
        page.exponents = _safe(verdicts.growth_exponents, prefill)
        page.gqa = _safe(tables.gqa_comparison, pd.concat([prefill, decode]))
        batch = min(P.get("decode_batches", [1]))
        page.spread = _safe(verdicts.spreads, prefill, decode if not decode.empty else None, decode_batch=batch)
        if not decode.empty and not masks.empty:
            page.recommendations = _safe(
                lambda: recommend.recommend(
                    recommend.regimes(prefill, decode, masks, long_from=P["long_from"], small_batch=P["small_batch"])
                )
            )
    return page


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The best attention forward measured (TFLOP/s, median over repeats), the kernel that ran it; None if not
    measured."""
    p = pool_repeats(rows(runs, "prefill"), SHAPE)
    if p.empty:
        return None
    p = p[p["status"].eq("ok")].dropna(subset=["achieved_tflop_s"])
    if p.empty:
        return None
    best = p.loc[p["achieved_tflop_s"].idxmax()]
    kernel = best["backend"] if isinstance(best["backend"], str) and best["backend"] else best["variant"]
    what = f"best attention forward measured ({kernel}, {best['dtype']}, {int(best['q_len'])} tokens)"
    return f"{best['achieved_tflop_s']:.0f} TFLOP/s", what


def published(r: Study5Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, published_value(r.runs), r.device)


# ---- takeaways -------------------------------------------------------------------------------------------------
def takeaways(r: Study5Page) -> str:
    """One sentence per claim, then what the kernels reach: every number from the runs."""
    if not r.runs.measured:
        return ""
    return takeaway_list(
        [finding_sentence(f) for f in r.findings]
        + [speedup_sentence(r), memory_sentence(r), decode_sentence(r), mask_sentence(r)]
    )


def speedup_sentence(r: Study5Page) -> str:
    if r.speedups.empty or r.ceilings is None:
        return ""
    at = r.speedups[r.speedups["q_len"].eq(SEED_COMPARISON_LENGTH)]
    if at.empty:
        return ""
    best = tables.best_point(r.prefill, "pct_of_floor")
    return (
        f"At {SEED_COMPARISON_LENGTH:,} tokens SDPA's default is {at['speedup'].min():.1f}–{at['speedup'].max():.1f}× "
        f"faster than naive attention across the {len(at)} configurations, each from its median times over the "
        f"repeats (the RTX 2070: {seed_value('F5.1')}; F5.1's note gives one repeat's range). "
        f"The closest any "
        f"kernel comes to the roofline floor is {best['pct_of_floor']:.0f}% ({best['variant']}, {best['arch']} "
        f"heads, D={int(best['head_dim'])}, {int(best['q_len']):,} tokens): {best['achieved_tflop_s']:,.3g} TFLOP/s "
        f"against the {r.ceilings.matmul_tflop_s:,.3g} TFLOP/s matmul ceiling."
    )


def _naive_oom_clause(r: Study5Page) -> str:
    oom = tables.first_failures(r.prefill, ("oom",))
    naive = oom[oom["variant"].eq("naive")]
    if naive.empty:
        return f"; naive attention fit in memory up to {int(r.prefill['q_len'].max()):,} tokens on every configuration"
    return "; naive attention ran out of memory at " + ", ".join(
        f"{int(x.first_failure_len):,} tokens ({x.config}, after {x.peak_at_longest_ok_bytes / 1e9:,.1f} GB at "
        f"{int(x.longest_ok_len):,})"
        for x in naive.itertuples()
    )


def memory_sentence(r: Study5Page) -> str:
    g = r.growth
    if g.empty or r.exponents.empty:
        return ""
    g0 = g[g["short"].eq(g["short"].min())]
    if not {"naive", "sdpa_default"} <= set(g0["variant"]):
        return ""
    gv = g0.groupby("variant")["growth_incl_inputs"]
    e = r.exponents
    return (
        f"From {int(g0['short'].min()):,} to {int(g0['long'].min()):,} tokens, naive attention's peak memory grows "
        f"{gv.min()['naive']:.0f}–{gv.max()['naive']:.0f}× and SDPA's default {gv.min()['sdpa_default']:.1f}–"
        f"{gv.max()['sdpa_default']:.1f}× (Q/K/V included; the RTX 2070: {seed_value('F5.2')}). "
        "Fitted exponents: naive "
        f"{e[e['variant'].eq('naive')]['exponent'].median():.2f}, SDPA default "
        f"{e[e['variant'].eq('sdpa_default')]['exponent'].median():.2f}{_naive_oom_clause(r)}."
    )


def decode_sentence(r: Study5Page) -> str:
    if r.decode.empty or not r.decode["status"].eq("ok").any() or r.ceilings is None:
        return ""
    top = tables.best_point(r.decode, "achieved_gb_s")
    text = (
        f"Decode is bandwidth-bound: the best decode point reads K and V at {top['achieved_gb_s']:,.0f} GB/s "
        f"({100 * top['achieved_gb_s'] / r.ceilings.copy_gb_s:.0f}% of the {r.ceilings.copy_gb_s:,.0f} GB/s copy "
        f"ceiling; {top['variant']}, {top['arch']}, batch {int(top['batch'])}, KV {int(top['kv_len']):,})."
    )
    dq = r.gqa[r.gqa["q_len"].eq(1)] if not r.gqa.empty else r.gqa
    if len(dq):
        text += (
            f" Repeating K/V heads instead of `enable_gqa` costs a median {dq['repeat_over_gqa'].median():.1f}× in "
            f"decode (range {dq['repeat_over_gqa'].min():.1f}–{dq['repeat_over_gqa'].max():.1f}×)."
        )
    return text


def mask_sentence(r: Study5Page) -> str:
    if r.masks.empty:
        return ""
    ok = r.masks[r.masks["status"].eq("ok")]
    mt = ok.pivot_table(index=["mask", "q_len"], columns="variant", values="median_ms")
    if not ({"flex", "sdpa_default"} <= set(mt.columns) and "sliding_window" in mt.index.get_level_values(0)):
        return ""
    sw = mt.loc["sliding_window"].dropna()
    if sw.empty:
        return ""
    n = int(sw.index.max())
    flex, dense = sw.loc[n, "flex"], sw.loc[n, "sdpa_default"]
    caveat = "" if r.kind == "cuda" else " — on the CPU Flex runs unfused, so this ratio says nothing about the GPU"
    return (
        f"Sliding window at {n:,} tokens with a {r.P['window']:,}-token window: FlexAttention's block mask takes "
        f"{flex:.3g} ms and SDPA with the same window as a dense mask {dense:.3g} ms (dense / block: "
        f"{dense / flex:.3g}×){caveat}."
    )


def not_judged(r: Study5Page) -> str:
    """Markdown naming each claim the data could not judge, and why (empty when all were judged)."""
    return takeaway_list(f"not judged: {p}" for p in r.problems) if r.problems else ""


# ---- method and details ----------------------------------------------------------------------------------------
def setup(r: Study5Page) -> str:
    """The device, the measured ceilings and SDPA's priority order, as the method section states them."""
    if not r.runs.measured or r.ceilings is None:
        return "Not measured."
    c, dev = r.ceilings, r.runs.device
    text = (
        f"Device: {r.device} ({dev.get('kind', '?')}, torch {dev.get('torch', '?')}). Profile "
        f"{r.P.get('profile', '?')}, {r.P.get('dtype', '?')}; measured ceilings: copy {c.copy_gb_s:,.0f} GB/s "
        f"(read+write), {c.matmul_dtype} matmul {c.matmul_tflop_s:,.1f} TFLOP/s. SDPA backend priority order (after "
        f"a first call): {' > '.join(r.sdpa_order) or 'not recorded'}."
    )
    if r.kind != "cuda":
        text += (
            " No CUDA device: SDPA's efficient and cuDNN backends are recorded as unsupported; FlexAttention runs "
            "its unfused eager path, checked for correctness but not timed; peak memory is counted by a tensor tracker."
        )
    return text


READABLE = {"kv_heads": "KV heads", "head_dim": "head dim", "q_len": "query length (tokens)", "arch": "model heads"}


def _yes_no(s: pd.Series) -> pd.Series:
    return s.map({True: "yes", False: "no"}).fillna(s)


def dispatch_view(r: Study5Page) -> pd.DataFrame:
    cols = ["shape", "arch", "heads", "kv_heads", "head_dim", "picked", "ran", "agree"]
    v = r.dispatch[[c for c in cols if c in r.dispatch]].reset_index(drop=True)
    if "agree" in v:
        v = v.assign(agree=_yes_no(v["agree"]))
    return v.rename(columns=READABLE)


def outcomes_view(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: points per status, the worst relative error and its tolerance."""
    if df.empty:
        return df
    return tables.outcomes(df).round(4).rename(columns={"max_rel_error": "worst relative error"})


def oom_view(r: Study5Page) -> pd.DataFrame:
    f = tables.first_failures(r.prefill, ("oom",)) if not r.prefill.empty else pd.DataFrame()
    if f.empty:
        return f
    v = f.assign(
        first_failure_len=f["first_failure_len"].map(_tokens),
        longest_ok_len=f["longest_ok_len"].map(_tokens),
        peak_at_longest_ok_gb=(f["peak_at_longest_ok_bytes"] / 1e9).round(2),
    ).drop(columns="peak_at_longest_ok_bytes")
    return v.rename(
        columns={
            "first_failure_len": "first failing length (tokens)",
            "longest_ok_len": "longest length run (tokens)",
            "peak_at_longest_ok_gb": "peak memory there (GB)",
        }
    )


def _tokens(x) -> str:
    return f"{int(x):,}" if pd.notna(x) else "—"


def exponents_view(r: Study5Page) -> pd.DataFrame:
    if r.exponents.empty:
        return r.exponents
    return verdicts.with_config(r.exponents).pivot_table(index="variant", columns="config", values="exponent").round(2)


def masks_view(r: Study5Page) -> pd.DataFrame:
    t = r.masks.pivot_table(index=["mask", "q_len"], columns="variant", values="median_ms").round(3).reset_index()
    return t.assign(q_len=t["q_len"].map(_tokens)).rename(columns=READABLE).set_index(["mask", READABLE["q_len"]])


def spread_view(r: Study5Page) -> pd.DataFrame:
    cols = ["regime", "length", "comparison", "fixed", "spread", "slowest", "fastest"]
    return r.spread[cols].round(2) if not r.spread.empty else r.spread


def recommendations_view(r: Study5Page) -> pd.DataFrame:
    cols = {
        "regime": "regime",
        "recommended": "recommended",
        "backend": "SDPA backend",
        "slowdown_vs_best_per_shape": "slowdown vs the best per shape (×)",
        "runner_up": "runner-up",
        "runner_up_slowdown": "runner-up's slowdown (×)",
        "naive_slowdown": "naive attention's slowdown (×)",
    }
    if r.recommendations.empty:
        return r.recommendations
    out = r.recommendations[list(cols)].round(2)
    out["backend"] = out["backend"].replace("", "—")
    # a masked regime has no naive variant to compare with
    out["naive_slowdown"] = out["naive_slowdown"].astype(object).where(out["naive_slowdown"].notna(), "not run")
    return out.rename(columns=cols)


def gqa_view(r: Study5Page) -> pd.DataFrame:
    return tables.gqa_summary(r.gqa).round(2).rename(columns=READABLE) if not r.gqa.empty else r.gqa


def device_memory_bytes(r: Study5Page) -> float | None:
    gib = r.runs.device.get("memory_gib")
    return float(gib) * 2**30 if r.kind == "cuda" and gib else None
