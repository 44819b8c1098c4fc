"""Study 4's page text from its run: the takeaways, each section's sentences (capacity, compaction, overlap) and
compact tables (about a dozen rows at most, units in the headings; the full tables are the run's CSVs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.tested_on import model_name
from servelab.studies.s04_kv_cache.compaction_bench import mover_ratio
from servelab.studies.s04_kv_cache.run import Study4Run
from servelab_book.published import render_published


def capacity_sentence(r: Study4Run) -> str:
    """Sequences held mid-decode in the budget: contiguous preallocation against paged blocks of each size."""
    P, cap = r.P, r.capacity
    mid = cap.summary[cap.summary.phase == "mid_decode"].set_index(["layout", "block_size"])
    contig = mid.loc[("contiguous", P["capacity_max_len"])]
    paged = mid.loc[("paged", P["block_sizes"][0])]
    by_block = ", ".join(f"{bs}-token {mid.loc[('paged', bs)].fragmentation_pct:.1f}%" for bs in P["block_sizes"])
    return (
        f"With {cap.bytes_per_token / 1024:g} KiB/token ({model_name(P['capacity_model'])}, {P['capacity_dtype']}) "
        f"and a {P['capacity_budget_gib']} GiB budget, contiguous preallocation of {P['capacity_max_len']:,} tokens "
        f"per request holds {contig.sequences:,.0f} sequences and wastes {contig.fragmentation_pct:.0f}% of what it "
        f"reserves; paged {P['block_sizes'][0]}-token blocks hold {paged.sequences:,.0f} sequences mid-decode "
        f"({paged.sequences / contig.sequences:.1f}×), wasting {paged.fragmentation_pct:.1f}%. Larger blocks waste "
        f"more: {by_block}."
    )


def takeaways(r: Study4Run) -> str:
    """One sentence per claim, then what paging buys in capacity."""
    return takeaway_list([finding_sentence(f) for f in r.findings] + [capacity_sentence(r)])


def note(r: Study4Run, claim_id: str) -> str:
    """The rule and the numbers behind one claim's verdict (its ``Finding.note``)."""
    f = next(f for f in r.findings if f.id == claim_id)
    return f"**{f.id} {f.verdict}.** {f.note}."


def _pool(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def compaction_sentences(r: Study4Run) -> str:
    """The movers against each other: the per-block loop's launches, and gather/scatter on 64-bit words."""
    comp = r.compaction
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
        out.append(
            f"Moving the same bytes as 64-bit words instead of {r.element_bytes}-byte elements made gather/scatter "
            f"{wide.ratio.median():.1f}× faster (median over the sweep; "
            f"{wide.ratio.min():.1f}–{wide.ratio.max():.1f}×)."
        )
    return takeaway_list(out)


def _kernels_and_clocks(ov) -> str:
    kk = ov.kernels.dropna(subset=["alone_us"])
    text = (
        f"Per kernel (torch.profiler), the compaction's kernels took {kk.during_decode_ratio.min():.2f}–"
        f"{kk.during_decode_ratio.max():.2f}× their time alone while decode ran"
    )
    sm = pd.to_numeric(ov.clocks["clocks.sm"], errors="coerce") if "clocks.sm" in ov.clocks else pd.Series(dtype=float)
    return text + (
        f"; the SM clock read {sm.min():,.0f}–{sm.max():,.0f} MHz in every condition." if sm.notna().any() else "."
    )


def _cold_start(cold: pd.DataFrame) -> str:
    c = cold.groupby("state")[["compaction_ms", "sm_clock_mhz"]].median()
    idle, busy = c.loc["cold", "sm_clock_mhz"], c.loc["warm", "sm_clock_mhz"]
    clock = "" if np.isnan(idle) else f" (SM clock {idle:,.0f} MHz while idle, {busy:,.0f} MHz busy)"
    return (
        f"Order matters: a compaction started from an idle GPU took {c.loc['cold', 'compaction_ms']:.3f} ms{clock}, "
        f"{c.loc['cold', 'compaction_ms'] / c.loc['warm', 'compaction_ms']:.2f}× its back-to-back time of "
        f"{c.loc['warm', 'compaction_ms']:.3f} ms."
    )


def overlap_sentences(r: Study4Run) -> str:
    """What the GPU-only probes add to F4.4: per-kernel times, clocks, and the cost of starting from idle."""
    ov = r.overlap
    out = []
    if not ov.kernels.empty:
        out.append(_kernels_and_clocks(ov))
    if ov.cold is not None:
        out.append(_cold_start(ov.cold))
    if not out:
        out.append("This run had no CUDA device: no concurrent condition, kernel profile or clocks (GPU only).")
    return takeaway_list(out)


def bpt_view(bpt: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "model",
        "attention",
        "dtype",
        "layers",
        "kv_heads",
        "head_dim",
        "formula_bytes",
        "hf_bytes_per_token",
        "hf_storage_bytes_per_token",
        "pool_bytes_per_token",
        "pool_allocator_bytes_per_token",
        "exact",
        "status",
    ]
    return bpt[[c for c in cols if c in bpt]].assign(model=bpt["model"].map(model_name))


def capacity_view(r: Study4Run) -> pd.DataFrame:
    s = r.capacity.summary.rename(
        columns={
            "block_size": "block (tokens)",
            "fragmentation_pct": "fragmentation (%)",
            "budget_used_pct": "budget used (%)",
        }
    )
    return s.round(1)


def variation_view(var: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "ms_min": "min (ms)",
        "ms_max": "max (ms)",
        "variation_pct": "variation (%)",
        "marginal_kv_gb_s": "marginal KV read (GB/s)",
        "fit_r2": "fit r²",
        "pct_of_floor_at_max_context": "% of floor at longest context",
        "kv_share_of_bytes_at_max_context": "KV share of bytes there",
    }
    return var[["mode", "batch", *cols]].rename(columns=cols).round(3)


def compaction_view(comp: pd.DataFrame) -> pd.DataFrame:
    """Median GB/s per mover and block size over pools and fractions moved (every point is ``compaction.csv``)."""
    ok = comp[comp.status == "ok"]
    if ok.empty:
        return pd.DataFrame()
    return ok.pivot_table(index="method", columns="block_size", values="gb_s", aggfunc="median").round(0)


def overlap_view(runs: pd.DataFrame) -> pd.DataFrame:
    """Median milliseconds of each part, per decode batch and condition."""
    g = runs.groupby(["decode_batch", "condition"])[["compaction_ms", "decode_ms", "total_ms"]].median()
    return g.rename(columns=lambda c: c.replace("_ms", " (ms)")).round(3)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("04_kv_cache")
