"""Study 4's reporting path: everything its page shows, computed from the runs' files (``report``), and the page
text: takeaways, each section's sentences (capacity, compaction, overlap) and compact tables (about a dozen rows at
most, units in the headings; the full tables are the runs' CSVs).

Each repeat's verdicts come from its own raw tables (``repeat_findings``); the page's tables and figures show each
point's median over repeats. A table a run did not write (a part that did not run, a deleted CSV) leaves its claim
inconclusive, "not measured", and its section says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from servelab.studies.common.findings import Finding, not_measured
from servelab.studies.common.markdown import separated
from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.published import published_section
from servelab.studies.common.runs import RunSet, pool_repeats
from servelab.studies.common.study_page import StudyPage
from servelab.studies.common.tested_on import model_name
from servelab.studies.s04_kv_cache import verdicts
from servelab.studies.s04_kv_cache.derived import mover_ratio, overlap_summary, variation_summary

STUDY = "04_kv_cache"
# the rig's own record of each overlap experiment (old runs wrote it into overlap_summary.csv)
RIG_COLUMNS = [
    "pool_mib",
    "pool_blocks",
    "block_size",
    "blocks_moved",
    "bytes_moved",
    "decode_batch",
    "decode_context",
    "decode_mode",
    "decode_mode_note",
    "decode_steps",
    "probe_compaction_ms",
    "probe_decode_step_ms",
]
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PUBLISHED_BLOCK = 16  # vLLM's block size, the published waste's


@dataclass
class Study4Page(StudyPage):
    bpt: pd.DataFrame = field(default_factory=pd.DataFrame)  # bytes per token, per case (the first repeat's)
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)  # every trial of every repeat
    capacity_fixed: pd.DataFrame = field(default_factory=pd.DataFrame)
    capacity_summary: pd.DataFrame = field(default_factory=pd.DataFrame)  # medians per phase, layout, block size
    decode_steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # median over repeats per point
    variation: pd.DataFrame = field(default_factory=pd.DataFrame)  # variation_summary of those
    compaction: pd.DataFrame = field(default_factory=pd.DataFrame)  # median over repeats per point
    overlap_runs: pd.DataFrame = field(default_factory=pd.DataFrame)  # every round of every repeat
    overlap_summary: pd.DataFrame = field(default_factory=pd.DataFrame)  # per decode batch, over all rounds
    overlap_kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    overlap_clocks: pd.DataFrame = field(default_factory=pd.DataFrame)
    overlap_cold: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def params(self) -> dict:
        return self.runs.params

    @property
    def copy_gb_s(self) -> float:
        return float(self.runs.ceilings.get("copy_gb_s", np.nan))


def _has(df: pd.DataFrame, *cols: str) -> bool:
    return not df.empty and all(c in df for c in cols)


def rig_table(runs: RunSet) -> pd.DataFrame:
    """Each overlap experiment's rig (``overlap_rig.csv``; in older runs, the rig's columns of ``overlap_summary``)."""
    rig = runs.table("overlap_rig")
    if rig.empty:
        old = runs.table("overlap_summary")
        rig = old[[c for c in ["repeat", "part", *RIG_COLUMNS] if c in old]]
    return rig


def overlap_table(overlap_runs: pd.DataFrame, rig: pd.DataFrame) -> pd.DataFrame:
    """One row per decode batch: its rig and ``overlap_summary`` of its rounds (every repeat's rounds pooled)."""
    if not _has(overlap_runs, "condition", "compaction_ms"):
        return pd.DataFrame()
    runs = overlap_runs if "decode_batch" in overlap_runs else overlap_runs.assign(decode_batch=0)
    rig = rig.drop(columns=[c for c in ("repeat", "part") if c in rig]).drop_duplicates("decode_batch")
    rows = []
    for batch, g in runs.groupby("decode_batch", sort=True):
        info = rig[rig["decode_batch"] == batch].iloc[0].to_dict() if "decode_batch" in rig else {}
        rows.append({**info, "decode_batch": batch, **overlap_summary(g)})
    return pd.DataFrame(rows)


def _not_measured(fid: str, why: str) -> Finding:
    return next(f for f in not_measured(STUDY, why) if f.id == fid)


def repeat_findings(rep: RunSet, shown: pd.DataFrame | None = None) -> list[Finding]:
    """F4.1–F4.4 by today's rules from one repeat's raw tables; a claim whose table is missing is not measured.
    ``shown``: the page's variation table (over the repeats' median step times), which F4.2's note quotes."""
    P, copy = rep.params, float(rep.ceilings.get("copy_gb_s", np.nan))
    model, dtype = P.get("decode_model", ""), P.get("decode_dtype")
    bpt, steps, comp = rep.table("bytes_per_token"), rep.table("decode_steps"), rep.table("compaction")
    overlap = overlap_table(rep.table("overlap_runs"), rig_table(rep))
    missing = "this repeat wrote no {} table"
    return [
        verdicts.f41(bpt) if _has(bpt, "status") else _not_measured("F4.1", missing.format("bytes_per_token")),
        verdicts.f42(variation_summary(steps), copy, dtype, shown)
        if _has(steps, "status")
        else _not_measured("F4.2", missing.format("decode_steps")),
        verdicts.f43(comp, copy, model, dtype)
        if _has(comp, "status")
        else _not_measured("F4.3", missing.format("compaction")),
        verdicts.f44(overlap, rep.device.get("kind") == "cuda", model, dtype)
        if not overlap.empty
        else _not_measured("F4.4", missing.format("overlap_runs")),
    ]


def capacity_summary(cap: pd.DataFrame) -> pd.DataFrame:
    """Medians over trials (and repeats) per phase, layout and block size."""
    if not _has(cap, "phase", "layout", "block_size"):
        return pd.DataFrame()
    cols = ["sequences", "fragmentation_pct", "budget_used_pct"]
    return cap.groupby(["phase", "layout", "block_size"])[cols].median().reset_index()


def report(runs: RunSet) -> Study4Page:
    """The page's record from ``runs`` (nothing measured: every claim inconclusive, every table empty)."""
    if not runs.measured:
        return Study4Page(runs, not_measured(STUDY))
    steps = pool_repeats(runs.table("decode_steps"), ["model", "mode", "batch", "context"])
    variation = variation_summary(steps) if _has(steps, "status") else pd.DataFrame()
    findings = runs.combined(lambda rep: repeat_findings(rep, variation))
    comp = pool_repeats(runs.table("compaction"), ["pool_mib", "block_size", "move_fraction", "method"])
    cap = runs.table("capacity")
    overlap_runs = runs.table("overlap_runs")
    return Study4Page(
        runs,
        findings,
        bpt=runs.first("bytes_per_token"),
        capacity=cap,
        capacity_fixed=runs.first("capacity_fixed_length"),
        capacity_summary=capacity_summary(cap),
        decode_steps=steps,
        variation=variation,
        compaction=comp,
        overlap_runs=overlap_runs,
        overlap_summary=overlap_table(overlap_runs, rig_table(runs)),
        overlap_kernels=runs.table("overlap_kernels"),
        overlap_clocks=runs.table("overlap_clocks"),
        overlap_cold=runs.table("overlap_cold_start"),
    )


PHASES = {"mid_decode": "requests caught mid-decode", "complete": "every request at its full length"}


def published_value(runs: RunSet) -> tuple[str, str] | None:
    """The KV memory paged allocation wastes: the median fragmentation of the paged pool with 16-token blocks (the
    smallest measured where 16 was not), over trials and repeats, in the snapshot of a running server (requests
    caught mid-decode, the takeaway's), the like-for-like of the waste a serving system reports while it runs; at
    full length where no mid-decode snapshot was taken. The full-length 1.1% stood beside vLLM's figure while the
    takeaway said 1.5%."""
    cap = runs.table("capacity") if runs.measured else pd.DataFrame()
    if not _has(cap, "layout", "phase", "block_size", "fragmentation_pct"):
        return None
    paged = cap[cap["layout"] == "paged"]
    phase = next((ph for ph in PHASES if (paged["phase"] == ph).any()), None)
    if phase is None:
        return None
    paged = paged[paged["phase"] == phase]
    block = PUBLISHED_BLOCK if (paged["block_size"] == PUBLISHED_BLOCK).any() else int(paged["block_size"].min())
    frac = paged.loc[paged["block_size"] == block, "fragmentation_pct"].median()
    return f"{frac:.2g} %", f"paged pool, {block}-token blocks, {PHASES[phase]}, median over trials"


def published(r: Study4Page) -> str:
    """The "Against published results" section: the field's numbers beside this study's, each cited."""
    return published_section(STUDY, published_value(r.runs), r.device)


# ---- page text ----------------------------------------------------------------------------------------------------
def capacity_sentence(r: Study4Page) -> str:
    """Sequences held mid-decode in the budget: contiguous preallocation against paged blocks of each size."""
    s = r.capacity_summary
    if s.empty or not (s.phase == "mid_decode").any():
        return ""
    P = r.params
    mid = s[s.phase == "mid_decode"].set_index(["layout", "block_size"])
    contig = mid.xs("contiguous", level="layout").iloc[0]
    paged = mid.xs("paged", level="layout").sort_index()
    first_bs = int(paged.index[0])
    kib = r.capacity["bytes_per_token"].iloc[0] / 1024
    by_block = ", ".join(f"{bs}-token {row.fragmentation_pct:.1f}%" for bs, row in paged.iterrows())
    return (
        f"With {kib:g} KiB/token ({model_name(P.get('capacity_model', ''))}, {P.get('capacity_dtype', '')}) "
        f"and a {P.get('capacity_budget_gib')} GiB budget, contiguous preallocation of "
        f"{P.get('capacity_max_len', 0):,} tokens per request holds {contig.sequences:,.0f} sequences and wastes "
        f"{contig.fragmentation_pct:.0f}% of what it reserves; paged {first_bs}-token blocks hold "
        f"{paged.iloc[0].sequences:,.0f} sequences mid-decode ({paged.iloc[0].sequences / contig.sequences:.1f}×), "
        f"wasting {paged.iloc[0].fragmentation_pct:.1f}%. Larger blocks waste more: {by_block}."
    )


def takeaways(r: Study4Page) -> str:
    """One sentence per claim, then what paging buys in capacity."""
    return takeaway_list([finding_sentence(f) for f in r.findings] + [capacity_sentence(r)])


def note(r: Study4Page, claim_id: str) -> str:
    """The rule and the numbers behind one claim's verdict (its ``Finding.note``)."""
    f = next(f for f in r.findings if f.id == claim_id)
    return f"**{f.id} {f.verdict}.** {f.note}."


def _pool(mib: float) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def compaction_sentences(r: Study4Page) -> str:
    """The movers against each other: the per-block loop's launches, and gather/scatter on 64-bit words."""
    comp = r.compaction
    if not _has(comp, "status", "method"):
        return ""
    ok = comp[comp.status == "ok"]
    ratio = mover_ratio(comp, "block_loop", "gather_scatter")
    wide = mover_ratio(comp, "gather_scatter", "gather_scatter_wide")
    out = []
    if len(ratio):
        worst = ratio.loc[ratio.ratio.idxmax()]
        loop = ok[ok.method == "block_loop"]
        per_pool = loop.groupby("pool_mib").us_per_block.median()
        out.append(
            f"The per-block loop costs a median {loop.us_per_block.median():.1f} µs per block moved (one kernel launch "
            "each; by pool size: " + ", ".join(f"{_pool(m)} {u:.0f} µs" for m, u in per_pool.items()) + "); "
            f"gather/scatter pays two launches in all. The loop's time over gather/scatter's ranges "
            f"{ratio.ratio.min():.2f}–{worst.ratio:.1f}×, the largest with {worst.blocks_moved:,.0f} blocks of "
            f"{worst.block_size:.0f} tokens moved."
        )
    if len(wide):
        nbytes = ELEMENT_BYTES.get(str(r.params.get("decode_dtype")), 2)
        out.append(
            f"Moving the same bytes as 64-bit words instead of {nbytes}-byte elements made gather/scatter "
            f"{wide.ratio.median():.1f}× faster (median over the sweep; "
            f"{wide.ratio.min():.1f}–{wide.ratio.max():.1f}×)."
        )
    return takeaway_list(out)


def _kernels_and_clocks(kernels: pd.DataFrame, clocks: pd.DataFrame) -> str:
    kk = kernels.dropna(subset=["alone_us"]) if "alone_us" in kernels else kernels.iloc[:0]
    if kk.empty or "during_decode_ratio" not in kk:
        return ""
    text = (
        f"Per kernel (torch.profiler), the compaction's kernels took {kk.during_decode_ratio.min():.2f}–"
        f"{kk.during_decode_ratio.max():.2f}× their time alone while decode ran"
    )
    sm = pd.to_numeric(clocks["clocks.sm"], errors="coerce") if "clocks.sm" in clocks else pd.Series(dtype=float)
    if sm.isna().all():
        return text + "."
    low, high = f"{sm.min():,.0f}", f"{sm.max():,.0f}"
    read = f"{low} MHz throughout," if low == high else f"{low}–{high} MHz"
    return text + f"; the SM clock read {read} in every condition."


def _cold_start(cold: pd.DataFrame) -> str:
    """The compaction from an idle GPU against back-to-back, and whether the SM clock dropped while idle: where it
    did not, the difference is not the clock's."""
    c = cold.groupby("state")[["compaction_ms", "sm_clock_mhz"]].median()
    if not {"cold", "warm"} <= set(c.index):
        return ""
    idle, busy = c.loc["cold", "sm_clock_mhz"], c.loc["warm", "sm_clock_mhz"]
    ratio = c.loc["cold", "compaction_ms"] / c.loc["warm", "compaction_ms"]
    said = (
        f"A compaction started from an idle GPU took {c.loc['cold', 'compaction_ms']:.3f} ms, {ratio:.2f}× its "
        f"back-to-back time of {c.loc['warm', 'compaction_ms']:.3f} ms"
    )
    if np.isnan(idle) or np.isnan(busy):
        return said + "."
    if f"{idle:,.0f}" == f"{busy:,.0f}":
        return (
            said + f"; the SM clock stayed at {idle:,.0f} MHz while idle and busy, so the difference is not a clock "
            "drop (its cause is not measured here)."
        )
    return said + f" (SM clock {idle:,.0f} MHz while idle, {busy:,.0f} MHz busy)."


def overlap_sentences(r: Study4Page) -> str:
    """What the GPU-only probes add to F4.4: per-kernel times, clocks, and the cost of starting from idle."""
    out = [_kernels_and_clocks(r.overlap_kernels, r.overlap_clocks)]
    if _has(r.overlap_cold, "state", "compaction_ms"):
        out.append(_cold_start(r.overlap_cold))
    if not any(out):
        out = ["These runs had no CUDA device: no concurrent condition, kernel profile or clocks (GPU only)."]
    return takeaway_list(out)


# ---- compact views --------------------------------------------------------------------------------------------------
def bpt_view(bpt: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "model": "model",
        "attention": "attention",
        "dtype": "dtype",
        "formula_bytes": "formula (B)",
        "hf_bytes_per_token": "HF tensors (B)",
        "hf_storage_bytes_per_token": "HF storages (B)",
        "pool_bytes_per_token": "pool (B)",
        "pool_allocator_bytes_per_token": "pool, allocator (B)",
        "exact": "exact",
    }
    v = bpt[[c for c in cols if c in bpt]].assign(model=bpt["model"].map(model_name))
    counts = [c for c in cols if c.endswith("bytes_per_token") or c == "formula_bytes"]
    v = v.assign(**{c: v[c].map(lambda x: f"{x:,.0f}" if pd.notna(x) else "—") for c in counts if c in v})
    return v.rename(columns=cols)


SNAPSHOTS = {"complete": "full length", "mid_decode": "mid-decode"}  # as the capacity figure names them


def capacity_view(summary: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "phase": "snapshot",
        "block_size": "block (tokens)",
        "sequences": "sequences",
        "fragmentation_pct": "fragmentation (%)",
        "budget_used_pct": "budget used (%)",
    }
    out = summary.assign(phase=summary["phase"].map(lambda p: SNAPSHOTS.get(p, p))) if "phase" in summary else summary
    return separated(out.rename(columns=cols).round(1), ["block (tokens)", "sequences"])


def variation_view(var: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "trend_pct": "fitted trend (%)",
        "variation_pct": "variation (%)",
        "marginal_kv_gb_s": "marginal KV read (GB/s)",
        "pct_of_floor_at_max_context": "% of floor at longest context",
    }
    out = var[["mode", "batch", *cols]].assign(mode=var["mode"].map(verdicts.mode_name))
    return separated(out.rename(columns=cols).round(1), ["marginal KV read (GB/s)"], decimals=1)


def compaction_caption(comp: pd.DataFrame) -> str:
    """What the compaction table's cells are: medians over the repeats, then over the pool sizes and fractions moved,
    so a cell is not any one point; F4.3's note gives each mover's range in one repeat."""
    ok = comp[comp.status == "ok"] if _has(comp, "status") else comp
    if ok.empty or not _has(ok, "pool_mib", "move_fraction"):
        return ""
    repeats = int(ok["n_repeats"].max()) if "n_repeats" in ok else 1
    over = f"the median over {repeats} repeats of each point, then " if repeats > 1 else ""
    return (
        f"*Each cell is {over}the median over the {ok['pool_mib'].nunique()} pool sizes and "
        f"{ok['move_fraction'].nunique()} fractions moved; F4.3's note below gives each mover's range over every "
        "point of one repeat.*"
    )


def compaction_view(comp: pd.DataFrame) -> pd.DataFrame:
    """Median GB/s per mover and block size over pools and fractions moved (every point is ``compaction.csv``)."""
    ok = comp[comp.status == "ok"] if _has(comp, "status") else comp
    if ok.empty:
        return pd.DataFrame()
    t = ok.pivot_table(index="method", columns="block_size", values="gb_s", aggfunc="median").round(0)
    t.columns = [f"{c}-token blocks (GB/s)" for c in t.columns]
    t = t.rename(index=verdicts.mover_name).rename_axis("mover").reset_index()
    return separated(t, [c for c in t if c != "mover"])


def condition_name(condition: str) -> str:
    """An overlap condition as the F4.4 section words it ("concurrent_prioritised": "concurrent, decode
    prioritised")."""
    return str(condition).replace("concurrent_prioritised", "concurrent, decode prioritised").replace("_", " ")


def overlap_view(runs: pd.DataFrame) -> pd.DataFrame:
    """Median milliseconds of each part, per decode batch and condition (every round of every repeat)."""
    g = runs.groupby(["decode_batch", "condition"])[["compaction_ms", "decode_ms", "total_ms"]].median().reset_index()
    g = g.assign(condition=g["condition"].map(condition_name))  # the section's words, not the run's identifiers
    g = g.rename(columns={"decode_batch": "decode batch"}).rename(columns=lambda c: c.replace("_ms", " (ms)"))
    return g.round(3)  # one header row: the reader's table, not a two-level index
