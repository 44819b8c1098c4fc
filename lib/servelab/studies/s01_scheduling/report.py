"""Study 1's page text from its run: the takeaways, the probe's costs against their floors, the capacity at the SLO,
and the compact tables the page shows (at most about a dozen rows; the full tables are the run's CSVs)."""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.page import finding_sentence, takeaway_list
from servelab.studies.common.tested_on import model_name
from servelab.studies.s01_scheduling.run import Study1Run
from servelab_book.published import render_published


def _setting(r) -> str:
    return f"{r['scheduler']}@{r['budget']}" if r["scheduler"] == "chunked_prefill" else r["scheduler"]


def capacity_sentences(capacity: pd.DataFrame) -> list[str]:
    """Per model: the setting with the highest capacity at the ITL SLO, or that none met it."""
    out = []
    for model, g in capacity.groupby("model", sort=False):
        best = g.loc[g["capacity_req_s"].idxmax()]
        name = model_name(model)
        if best["capacity_req_s"] == 0:
            out.append(f"{name}: no setting met p99 ITL ≤ {best['slo_itl_ms']:.1f} ms at the lowest rate measured.")
            continue
        out.append(
            f"{name}: the highest capacity at p99 ITL ≤ {best['slo_itl_ms']:.1f} ms is {_setting(best)}'s, "
            f"{best['capacity_req_s']:.2f} req/s ({best['bound']})."
        )
    return out


def takeaways(r: Study1Run) -> str:
    """Three to five sentences: one per claim, then the capacity at the SLO per model."""
    caps = capacity_sentences(r.capacity) if not r.capacity.empty else []
    return takeaway_list([finding_sentence(f) for f in r.findings] + [" ".join(caps)])


def probe_lines(probes: pd.DataFrame) -> str:
    """Each model's probe: decode iteration and prefill cost against their roofline floors, the capacity estimate."""
    lines = []
    for _, pr in probes.iterrows():
        name = model_name(pr["model"])
        if pr.get("status") != "ok" or "decode_floor_ms" not in pr:
            lines.append(f"{name}: probe {pr.get('status')}; the sweep used the fallback rates.")
            continue
        lines.append(
            f"{name}: decode iteration {pr['decode_step_s'] * 1e3:.2f} ms at batch {pr['decode_batch']:.0f} = "
            f"{pr['decode_pct_of_floor']:.1f}% of its roofline floor ({pr['decode_floor_ms']:.3f} ms, "
            f"{pr['decode_bound']}-bound); prefill {pr['prefill_s_per_token'] * 1e6:.1f} µs/token = "
            f"{pr['prefill_pct_of_floor']:.1f}% of its floor ({pr['prefill_floor_us_per_token']:.2f} µs/token, "
            f"{pr['prefill_bound']}-bound); capacity estimate {pr['capacity_req_s']:.2f} req/s."
        )
    return takeaway_list(lines)


def capacity_view(capacity: pd.DataFrame) -> pd.DataFrame:
    """The capacity table with units in its headings, one row per model and setting."""
    if capacity.empty:
        return capacity
    c = capacity.assign(model=capacity["model"].map(model_name), setting=capacity.apply(_setting, axis=1))
    c = c[["model", "setting", "capacity_req_s", "slo_itl_ms", "lowest_rate", "bound"]]
    return c.rename(
        columns={
            "capacity_req_s": "capacity (req/s)",
            "slo_itl_ms": "ITL SLO (ms)",
            "lowest_rate": "lowest rate (req/s)",
        }
    ).round(2)


def run_view(summary: pd.DataFrame, rate_fraction: float) -> pd.DataFrame:
    """Every setting's latencies and throughput at one rate fraction (the full sweep is ``summary.csv``)."""
    if summary.empty or "status" not in summary:
        return summary
    s = summary[
        (summary["status"] == "ok") & (summary["sweep"] == "rate") & (summary["rate_fraction"] == rate_fraction)
    ]
    s = s.assign(model=s["model"].map(model_name), setting=s.apply(_setting, axis=1))
    cols = {
        "rate": "rate (req/s)",
        "ttft_p50_ms": "TTFT p50 (ms)",
        "ttft_p99_ms": "TTFT p99 (ms)",
        "itl_p99_ms": "ITL p99 (ms)",
        "max_itl_p99_ms": "worst stall, p99 of per-request max (ms)",
        "stall_ci": "its 95% CI (ms)",
        "max_itl_ms": "maximum (ms)",
        "delivered_tok_s": "delivered (tok/s)",
        "completed": "completed",
        "shortfall": "short of min_requests",
        "cut": "cut",
    }
    if "max_itl_p99_lo_ms" in s:
        s = s.assign(
            stall_ci=[
                f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(s["max_itl_p99_lo_ms"], s["max_itl_p99_hi_ms"], strict=True)
            ]
        )
    cols = {k: v for k, v in cols.items() if k in s.columns}
    return s[["model", "setting", *cols]].rename(columns=cols).round(1).reset_index(drop=True)


def shortfall_lines(summary: pd.DataFrame) -> str:
    """Every measured point that completed fewer than ``min_requests`` requests within its time cap (none hidden);
    a line saying so when every point reached it."""
    if summary.empty or "shortfall" not in summary:
        return ""
    s = summary[(summary["status"] == "ok") & (summary["shortfall"] > 0)]
    ok = summary[summary["status"] == "ok"]
    if s.empty:
        return (
            f"Every one of the {len(ok)} measured points completed at least {int(ok['min_requests'].max())} requests."
        )
    lines = [
        f"{model_name(r['model'])}, {_setting(r)} at {r['rate']:.2f} req/s ({r['sweep']} sweep): {int(r['completed'])} "
        f"completed of {int(r['min_requests'])} wanted within its {r['window_s']:.0f} s window"
        for _, r in s.iterrows()
    ]
    return f"{len(s)} of {len(ok)} measured points fell short of `min_requests`:\n\n" + takeaway_list(lines)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("01_scheduling")
