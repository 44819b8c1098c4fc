"""The "Beyond one GPU" page's generated parts (``book/beyond_one_gpu.md``; issue 31).

- ``beyond_status.md``: what was measured on more than one GPU, read from the results root: the runs under
  ``<device>/09_beyond_one_gpu/`` (none until a machine of several GPUs is lent), else that nothing was;
- ``beyond_capacity.md``: the simulator's prediction a cluster run will be set beside: the rate N = 1, 2, 4
  replicas sustain within the simulator page's SLO behind each router (``s08_simulator.replica_capacity``, computed
  by the simulator's report on the calibrated H200 cost model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root as default_results_root
from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.s08_simulator.replica_capacity import SINGLE
from servelab_book.findings import BOOK_DEVICE, study_page

STUDY = "08_simulator"
MULTI_GPU = "09_beyond_one_gpu"  # where a multi-GPU run's data goes: data/results/<device>/09_beyond_one_gpu/runs/
INCLUDES = ("beyond_status.md", "beyond_capacity.md")


def multi_gpu_runs(root: Path | None = None) -> list[Path]:
    """Every multi-GPU run folder (its ``run.json``'s folder) under the results root, on any device."""
    root = Path(root or default_results_root())
    return sorted(p.parent for p in root.glob(f"*/{MULTI_GPU}/runs/*/*/r*/run.json"))


def status_md(root: Path | None = None, page=None) -> str:
    runs = multi_gpu_runs(root)
    if not runs:
        return (
            ":::{admonition} Not measured on more than one GPU\n:class: warning\n"
            f"No run of several GPUs is in the results (`data/results/<device>/{MULTI_GPU}/` holds none): every GPU "
            "session of this project so far was lent a machine of one H200. What follows is the simulator's "
            "prediction alone, and what has been built and tested on CPUs.\n:::\n"
        )
    return "\n".join(measured_md(run, page) for run in runs)


def measured_md(run: Path, page=None) -> str:
    """One run of ``servelab.cluster.capacity_run``: its capacity per router and N, measured, and beside it the
    simulator's prediction where the run used the prediction's model and SLO (``page``: the simulator's record)."""
    meta = json.loads((run / "run.json").read_text())
    P, dev = meta.get("params", {}), meta.get("device", {})
    cap = pd.read_csv(run / "capacity.csv")
    lines = [
        f"**Measured** on {dev.get('gpus', '?')}× {dev.get('name', '?')} at {str(meta.get('git_commit', ''))[:7]} "
        f"({run.parts[-6]}, repeat {meta.get('repeat_index', 0)}): {P.get('model')}, SLO p99 TTFT ≤ "
        f"{P.get('slo_ttft_ms', math.nan):.0f} ms and p99 TPOT ≤ {P.get('slo_tpot_ms', math.nan):.1f} ms, "
        f"{P.get('requests_per_replica')} requests per replica per point, lengths {P.get('lengths_source', '?')}.",
        "",
        _md_table(capacity_table(cap)),
        "",
    ]
    pred = None if page is None or isinstance(page, str) else page.tables.get("replica_capacity")
    if pred is not None and not pred.empty and page.cap:
        slo_t, slo_p = page.cap["slo"]
        same = (
            str(P.get("model")) == str(page.cap["cost"].gpu.model)
            and math.isclose(float(P.get("slo_ttft_ms", math.nan)), slo_t, rel_tol=0.01)
            and math.isclose(float(P.get("slo_tpot_ms", math.nan)), slo_p, rel_tol=0.01)
        )
        if not same:
            lines.append(
                "The prediction above was made for another model or SLO "
                f"({page.cap['cost'].gpu.model}, {slo_t:.0f} / {slo_p:.1f} ms): no error is computed."
            )
        else:
            both = cap.merge(pred, on=["router", "replicas"], suffixes=("", "_sim"))
            both["error_pct"] = 100.0 * (both["met_req_s_sim"] - both["met_req_s"]) / both["met_req_s"]
            each = "; ".join(
                f"N = {r.replicas} {r.router}: {r.met_req_s:.1f} measured, {r.met_req_s_sim:.1f} simulated "
                f"({r.error_pct:+.0f} %)"
                for r in both.itertuples()
            )
            err = both["error_pct"].abs().median()
            lines.append(
                f"Against the prediction (the highest rate within the SLO): {each}. Median |error| **{err:.0f} %**."
            )
    return "\n".join(lines) + "\n"


def study8_report(root: Path | None = None, device: str = BOOK_DEVICE):
    """The simulator's page record over its runs on ``device``, or why there is none (str)."""
    return study_page(STUDY, root, device)


def _cell(row) -> str:
    if not math.isfinite(row.met_req_s):
        return "misses the SLO at every rate tried"
    top = "" if math.isfinite(row.missed_req_s) else "+ (no rate tried missed)"
    span = f"{row.met_req_s:.0f}–{row.missed_req_s:.0f}" if not top else f"≥ {row.met_req_s:.0f} {top}"
    return f"{span} req/s (×{row.scaling:.2f})" if row.replicas > 1 else f"{span} req/s"


def capacity_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per N, one column per router: the capacity bracket, and its scaling over N single replicas."""
    t = table.assign(cell=[_cell(r) for r in table.itertuples()])
    one = t[t["router"] == SINGLE]
    many = t[t["router"] != SINGLE]
    out = many.pivot(index="replicas", columns="router", values="cell")
    routers = list(dict.fromkeys(many["router"]))
    if not one.empty:
        row = pd.DataFrame({r: [one["cell"].iloc[0]] for r in routers}, index=pd.Index([1], name="replicas"))
        out = pd.concat([row, out])
    return out[routers].rename_axis(index="replicas", columns=None)


def _md_table(t: pd.DataFrame) -> str:
    header = ["replicas"] + [md_text(c) for c in t.columns]
    return list_table(header, [[str(n)] + [md_text(v) for v in row] for n, row in zip(t.index, t.values, strict=True)])


def capacity_md(page) -> str:
    if isinstance(page, str):
        return f"No prediction: the simulator's page: {page}.\n"
    table = page.tables.get("replica_capacity", pd.DataFrame())
    if table.empty or not page.cap:
        return "No prediction: the simulator's report replayed no model with Study 2's costs against Study 1's runs.\n"
    c, P, tried = page.cap, page.P, page.tables["replica_capacity_tried"]
    lengths = c["lengths"]
    prompt, output = lengths.means()
    top_n = table[table["replicas"] == table["replicas"].max()]
    best = top_n[top_n["met_req_s"] == top_n["met_req_s"].max()]
    lines = [
        f"Cost model: {c['cost'].gpu.model} on {page.device}, as calibrated on the simulator page "
        f"(Study 2's step costs and the serving overheads fitted on Study 1's runs). SLO: p99 TTFT ≤ "
        f"{c['slo'][0]:.0f} ms and p99 TPOT (a request's mean inter-token latency) ≤ {c['slo'][1]:.1f} ms, the "
        f"simulator page's. Poisson arrivals of Study 1's lengths (mean prompt {prompt:.0f}, mean output "
        f"{output:.0f} tokens), {P['replica_requests']} requests per replica per point "
        f"({tried['requests'].min():,}–{tried['requests'].max():,} simulated requests; {len(tried)} simulations), "
        "ChunkedPrefill replicas without a prefix cache.",
        "",
        _md_table(capacity_table(table)),
        "",
        f"*Each cell: the highest rate found within the SLO – the lowest found outside it (req/s), and in brackets "
        f"that rate over N times one replica's. Capacity is bracketed to a factor of "
        f"2^(1/{2 ** P['replica_refine']}).*",
        "",
        f"At {int(best['replicas'].iloc[0])} replicas the most within the SLO comes behind "
        f"{' and '.join(md_text(r) for r in best['router'])}: at least {best['met_req_s'].iloc[0]:.0f} req/s, "
        f"×{best['scaling'].iloc[0]:.2f} what {int(best['replicas'].iloc[0])} separate replicas would serve; "
        f"{md_text(', '.join(sorted(set(top_n['router']) - set(best['router']))) or 'no router')} "
        "falls short of it.",
    ]
    return "\n".join(lines) + "\n"


def beyond_page(root: Path | None = None, device: str = BOOK_DEVICE) -> dict[str, str]:
    """The page's includes by file name."""
    page = study8_report(root, device)
    return {"beyond_status.md": status_md(root, page), "beyond_capacity.md": capacity_md(page)}
