"""The "Beyond one GPU" page's generated parts (``book/beyond_one_gpu.md``; issue 31).

- ``beyond_status.md``: what was measured on more than one GPU, read from the results root: the runs under
  ``<device>/09_beyond_one_gpu/`` (none until a run on several GPUs), else that nothing was: each
  replicas run (``cluster.capacity_run``) beside the prediction, and the tensor parallel runs (``cluster.tp_run``)
  as one table over their repeats;
- ``beyond_capacity.md``: the simulator's prediction a cluster run will be set beside: the rate N = 1, 2, 4
  replicas sustain within the simulator page's SLO behind each router (``s08_simulator.replica_capacity``, computed
  by the simulator's report on the calibrated H200 cost model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from servelab.cluster import run_record
from servelab.measure.results import results_root as default_results_root
from servelab.studies.common.markdown import list_table, md_text
from servelab.studies.s08_simulator.replica_capacity import SINGLE
from servelab_book.findings import BOOK_DEVICE, study_page

STUDY = "08_simulator"
MULTI_GPU = run_record.STUDY  # where a multi-GPU run's data goes: data/results/<device>/09_beyond_one_gpu/runs/
INCLUDES = ("beyond_status.md", "beyond_capacity.md")


def multi_gpu_runs(root: Path | None = None) -> list[Path]:
    """Every multi-GPU run folder (its ``run.json``'s folder) under the results root, on any device."""
    root = Path(root or default_results_root())
    return sorted(p.parent for p in root.glob(f"*/{MULTI_GPU}/runs/*/*/r*/run.json"))


def _part(run: Path) -> str:
    return run.parent.name  # runs/<fingerprint>/<part>/r<k>


def status_md(root: Path | None = None, page=None) -> str:
    runs = multi_gpu_runs(root)
    lines = []
    if not any(json.loads((r / "run.json").read_text()).get("device", {}).get("gpus", 1) > 1 for r in runs):
        lines.append(
            ":::{admonition} Not measured on more than one GPU\n:class: warning\n"
            f"No run of several GPUs is in the results (`data/results/<device>/{MULTI_GPU}/` holds none): every "
            "measurement in this book was made on one GPU. What follows is the simulator's prediction"
            + (" beside what one GPU measured" if runs else " alone")
            + ", and what has been built and tested on CPUs.\n:::\n"
        )
    repeats: dict[tuple[str, int], list[Path]] = {}  # a replicas repeat's parts, one (N, router) each
    for run in runs:
        if not _part(run).startswith("tp"):
            repeats.setdefault((run.parts[-3], int(run.name[1:])), []).append(run)
    lines += [measured_md(group, page) for _, group in sorted(repeats.items())]
    tp = tp_md([run for run in runs if _part(run).startswith("tp")])
    return "\n".join([*lines, tp] if tp else lines)


def _repeats(runs: list[Path]) -> list[list[Path]]:
    """The runs by repeat (``r<k>``): a repeat's parts, one size each (``tp1``, ``tp2``, ``tp4``), or one run of
    every size."""
    by: dict[str, list[Path]] = {}
    for run in runs:
        by.setdefault(run.name, []).append(run)
    return [by[k] for k in sorted(by)]


def _read(parts: list[Path], name: str) -> pd.DataFrame:
    return pd.concat([pd.read_csv(p / name) for p in parts if (p / name).exists()], ignore_index=True)


def tp_repeat(parts: list[Path]) -> pd.DataFrame:
    """One tensor parallel repeat's medians per (TP, batch, prompt length): the time of the prefill and first token
    (``first_ms``), and of a decode step (``step_ms``: each sample's ``(whole - first) / (new_tokens - 1)``)."""
    s = _read(parts, "samples.csv")
    keys = ["tp", "batch", "prompt_tokens", "new_tokens", "sample"]
    wide = s.pivot_table(index=keys, columns="call", values="ms").reset_index()
    wide["step_ms"] = (wide["whole"] - wide["first"]) / (wide["new_tokens"] - 1)
    med = wide.groupby(["tp", "batch", "prompt_tokens"])[["first", "step_ms"]].median().reset_index()
    med = med.rename(columns={"first": "first_ms"})
    med.attrs["clocks"] = set(s["clock"])  # how the samples were timed, for the table's caption
    return med


def tp_summary(runs: list[Path]) -> pd.DataFrame:
    """Over the repeats: per (TP, batch, prompt length), the median of the repeats' medians with their range, and
    the decode step's speed-up over TP = 1 in the same repeat (median and range). ``attrs["clocks"]``: the clocks
    the samples were timed with."""
    per, clocks = [], set()
    for i, parts in enumerate(_repeats(runs)):
        t = tp_repeat(parts)
        clocks |= t.attrs["clocks"]
        one = t[t["tp"] == 1].set_index(["batch", "prompt_tokens"])["step_ms"]
        key = pd.MultiIndex.from_frame(t[["batch", "prompt_tokens"]])
        per.append(t.assign(repeat=i, speedup=one.reindex(key).to_numpy() / t["step_ms"].to_numpy()))
    both = pd.concat(per, ignore_index=True)
    g = both.groupby(["tp", "batch", "prompt_tokens"])
    out = g[["first_ms", "step_ms", "speedup"]].agg(["median", "min", "max"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
    out = out.assign(repeats=g["repeat"].nunique()).reset_index()
    out.attrs["clocks"] = clocks
    return out


def tp_tokens(runs: list[Path]) -> pd.DataFrame:
    """Per size above one, over the repeats: how many sequences kept one GPU's greedy tokens (the same prompts in
    the same repeat), and where the others first differed (the median index of the first differing token)."""
    rows = []
    for parts in _repeats(runs):
        t = _read(parts, "tokens.csv") if any((p / "tokens.csv").exists() for p in parts) else pd.DataFrame()
        if t.empty:
            continue
        t["ids"] = [json.loads(x) for x in t["tokens"]]
        one = t[t["tp"] == 1].set_index(["batch", "prompt_tokens", "sequence"])["ids"]
        for r in t[t["tp"] > 1].itertuples():
            ref = one.get((r.batch, r.prompt_tokens, r.sequence))
            if ref is None:
                continue
            first = next((i for i, (a, b) in enumerate(zip(ref, r.ids, strict=False)) if a != b), None)
            if first is None and len(ref) != len(r.ids):
                first = min(len(ref), len(r.ids))
            rows.append({"tp": r.tp, "same": first is None, "first_diff": first})
    if not rows:
        return pd.DataFrame(columns=["tp", "sequences", "same", "first_diff_median"])
    d = pd.DataFrame(rows)
    g = d.groupby("tp")
    return pd.DataFrame({"sequences": g.size(), "same": g["same"].sum(),
                         "first_diff_median": g["first_diff"].median()}).reset_index()  # fmt: skip


def _tokens_md(runs: list[Path], dtype: str) -> str:
    t = tp_tokens(runs)
    if t.empty:
        return ""
    each = "; ".join(
        f"TP = {r.tp}: {int(r.same)} of {int(r.sequences)} sequences identical"
        + (f", the others first differ at token {r.first_diff_median:.0f} (median)" if r.same < r.sequences else "")
        for r in t.itertuples()
    )
    return (
        f"Greedy tokens against one GPU's on the same prompts ({dtype}; a split adds its partial sums in another order "
        f"than one GPU's GEMMs, so where two logits are close the argmax can change): {each}.\n"
    )


def _spread(row, col: str, fmt: str) -> str:
    med, lo, hi = (getattr(row, f"{col}_{k}") for k in ("median", "min", "max"))
    if not math.isfinite(med):
        return "–"
    return f"{med:{fmt}} ({lo:{fmt}}–{hi:{fmt}})" if row.repeats > 1 else f"{med:{fmt}}"


def tp_md(runs: list[Path]) -> str:
    """The tensor parallel runs, grouped by machine and measuring code: per batch and prompt length, each size's
    time to first token and decode step, and the step's speed-up over one GPU, medians over the repeats."""
    groups: dict[tuple[str, str], list[Path]] = {}
    for run in runs:
        groups.setdefault((run.parts[-6], run.parts[-3]), []).append(run)
    lines = []
    for (folder, fp), group in groups.items():
        metas = [json.loads((r / "run.json").read_text()) for r in group]
        P, dev = metas[0].get("params", {}), metas[0].get("device", {})
        t = tp_summary(group)
        commits = ", ".join(sorted({str(m.get("git_commit", ""))[:7] for m in metas}))
        clock = "CUDA events" if t.attrs["clocks"] == {"cuda_event"} else "wall clock"
        n = len(_repeats(group))
        lines += [
            f"**Measured**, tensor parallel, on {dev.get('gpus', '?')}× {dev.get('name', '?')} ({folder}, measuring "
            f"code {fp}, commits {commits}): {md_text(P.get('model', '?'))} in {P.get('dtype', '?')}, "
            f"{n} repeat{'s' * (n > 1)} in fresh processes, {P.get('samples', '?')} timed calls "
            f"of each generation per repeat, {P.get('new_tokens', '?')} new tokens, greedy; "
            f"{clock}. Each cell: the median over the repeats of each repeat's median, with the repeats' range.",
            "",
            list_table(
                ["TP", "batch", "prompt tokens", "first token (ms)", "decode step (ms)", "step speed-up over TP = 1"],
                [
                    [
                        str(r.tp),
                        str(r.batch),
                        str(r.prompt_tokens),
                        _spread(r, "first_ms", ".2f"),
                        _spread(r, "step_ms", ".3f"),
                        "1" if r.tp == 1 else "×" + _spread(r, "speedup", ".2f"),
                    ]
                    for r in t.sort_values(["batch", "prompt_tokens", "tp"]).itertuples()
                ],
            ),  # fmt: skip
            "",
        ]
        tokens = _tokens_md(group, str(P.get("dtype", "?")))
        if tokens:
            lines.append(tokens)
        if n < 3:
            lines.append(f"*{n} repeat{'s' * (n > 1)} only: no conclusion is drawn from it.*\n")
    return "\n".join(lines)


def measured_md(runs: list[Path], page=None) -> str:
    """One repeat of the real replicas' capacity (``servelab.cluster.capacity_run``, in parts of one (N, router)
    each): its capacity per router and N, and beside it the simulator's prediction where the run used the
    prediction's model and SLO (``page``: the simulator's record)."""
    metas = [json.loads((run / "run.json").read_text()) for run in runs]
    P = metas[0].get("params", {})
    cap = pd.concat([pd.read_csv(run / "capacity.csv") for run in runs], ignore_index=True)
    one = cap.loc[cap["replicas"] == 1, "met_req_s"]
    cap["scaling"] = cap["met_req_s"] / (cap["replicas"] * (float(one.iloc[0]) if len(one) else math.nan))
    machines = ", ".join(
        sorted({f"{m.get('device', {}).get('gpus', '?')}× {m.get('device', {}).get('name', '?')}" for m in metas})
    )
    commits = ", ".join(sorted({str(m.get("git_commit", ""))[:7] for m in metas}))
    lines = [
        f"**Measured** on {machines} at {commits} ({', '.join(sorted({r.parts[-6] for r in runs}))}, repeat "
        f"{metas[0].get('repeat_index', 0)}, {len(runs)} part{'s' * (len(runs) > 1)}): {P.get('model')}, SLO p99 "
        f"TTFT ≤ {P.get('slo_ttft_ms', math.nan):.0f} ms and p99 TPOT ≤ {P.get('slo_tpot_ms', math.nan):.1f} ms, "
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
            lines += ["", replay_md(runs, page)]
    return "\n".join(lines) + "\n"


def replay_md(runs: list[Path], page) -> str:
    """The repeat's points replayed by the simulator on their own traces (``s08_simulator.cluster_replay``)."""
    from servelab.studies.s08_simulator import cluster_replay

    try:
        table = pd.concat([cluster_replay.replay_run(r, page.cap["cost"], page.cap["sched"]) for r in runs])
    except Exception as e:  # noqa: BLE001 - a run without what a replay reads: the page says so, the book builds
        return f"No replay of its points: {type(e).__name__}: {md_text(str(e))[:200]}."
    a = cluster_replay.agreement(table)
    errs = "; ".join(f"{m} {e:.0f} %" for m, e in a["median_abs_error_pct"].items())
    return (
        f"Each point replayed by the simulator on its own trace (send times, output lengths and prompts as sent; "
        f"the same router and N): the replay gives the real SLO verdict at **{a['same_verdict']} of {a['points']}** "
        f"points; median |error| per metric over the points, as in `sim_validation.csv`: {errs}."
    )


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
    if many.empty:  # one replica only (a one-GPU machine's part)
        return one.set_index("replicas")[["cell"]].rename(columns={"cell": SINGLE}).rename_axis(columns=None)
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
        *_one_replica_md(page),
        f"At {int(best['replicas'].iloc[0])} replicas the most within the SLO comes behind "
        f"{' and '.join(md_text(r) for r in best['router'])}: at least {best['met_req_s'].iloc[0]:.0f} req/s, "
        f"×{best['scaling'].iloc[0]:.2f} what {int(best['replicas'].iloc[0])} separate replicas would serve; "
        f"{md_text(', '.join(sorted(set(top_n['router']) - set(best['router']))) or 'no router')} "
        "falls short of it.",
        "",
        *_commands_md(page),
    ]
    return "\n".join(lines) + "\n"


def _one_replica_md(page) -> list[str]:
    """Why one replica's bracket here and the simulator page's "one replica sustains about …" differ: the two come from
    different traces, and a p99 over a few hundred requests moves with the trace."""
    one, tried = page.cap["one"], page.tables["replica_capacity_tried"]
    at = tried[(tried["replicas"] == 1) & ((tried["rate"] - one).abs() <= 1e-6 * one)]
    if at.empty:
        return []
    x = at.iloc[0]
    return [
        f"The simulator page's one replica sustains about {one:.1f} req/s at the same SLO: a coarser search (to a "
        f"factor of 2^(1/{2 ** page.P['rate_search_refine']})) on shorter traces (at most "
        f"{page.P['capacity_max_requests']:,} requests), which sets the unit of its rates. On this table's trace of "
        f"{x.requests:,.0f} requests that rate {'meets' if x.met else 'misses'} the SLO (p99 TTFT "
        f"{x.ttft_p99_ms:.0f} ms, p99 TPOT {x.tpot_p99_ms:.2f} ms against {page.cap['slo'][1]:.2f} ms): a p99 over a "
        "few hundred requests rests on its few slowest, and moves with the trace.",
        "",
    ]


def _commands_md(page) -> list[str]:
    """How a real run measures this prediction: the jobs, and the capacity run that one part makes."""
    from servelab.studies.s08_simulator import cluster_run

    part = next(p for p, (n, _) in cluster_run.PARTS.items() if n == max(n for n, _ in cluster_run.PARTS.values()))
    argv = cluster_run.replicas_argv(page, part, 0)
    return [
        "The real run measures this with the prediction's own settings, one part per N and router "
        f"(`{cluster_run.__name__}`, listed by `make gpu-plan GPUS=N` as `09_beyond_one_gpu:<part>:<repeat>`); "
        f"the part {md_text(part)} of repeat 0 runs:",
        "",
        "```bash",
        "python -m servelab.cluster.capacity_run " + " ".join(argv),
        "```",
    ]


def beyond_page(root: Path | None = None, device: str = BOOK_DEVICE) -> dict[str, str]:
    """The page's includes by file name."""
    page = study8_report(root, device)
    return {"beyond_status.md": status_md(root, page), "beyond_capacity.md": capacity_md(page)}
