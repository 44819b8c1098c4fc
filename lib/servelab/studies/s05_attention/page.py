"""Study 5's page: one run of every sweep (``run``), then one call per section of the notebook.

``run`` measures the ceilings, the dispatch table, causal prefill, decode and the masks, judges F5.1–F5.3 and
writes every table (``StudyResults``); the section functions show its tables and figures and generate the
takeaways from its numbers, so the notebook holds no analysis code and no typed number.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.findings import Finding
from servelab.studies.common.page import finding_notes, rerun_recipe, show, takeaway_list, verdict_table
from servelab.studies.common.style import use_book_style
from servelab.studies.s05_attention import memory, plots, recommend, report, verdicts
from servelab.studies.s05_attention.backends import dispatch_table, priority_order
from servelab.studies.s05_attention.params import SEED_COMPARISON_LENGTH
from servelab.studies.s05_attention.point import TimingPolicy
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.sweep import add_roofline, decode_sweep, mask_factories, mask_sweep, prefill_sweep
from servelab_book.published import render_published

SLUG = "05_attention"


@dataclass
class Run:
    """Everything the page shows, from one run: the parameters, the device and its ceilings, the tables."""

    P: dict
    dev: object  # servelab.measure.device.DeviceRecord
    ceil: object  # servelab.measure.ceilings.Ceilings
    roof: Roofline
    sdpa_order: list[str]
    dispatch: pd.DataFrame
    prefill: pd.DataFrame
    decode: pd.DataFrame
    masks: pd.DataFrame
    speedups: pd.DataFrame
    growth: pd.DataFrame
    exponents: pd.DataFrame
    gqa: pd.DataFrame
    spread: pd.DataFrame
    recommendations: pd.DataFrame
    findings: list[Finding]
    problems: list[str]


def _primary(P: dict) -> tuple[str, int]:
    """F5.1 and F5.2's configuration: the first model at its own head dim, or the largest swept one."""
    model = P["models"][0]
    d = Architecture.from_model(model).head_dim
    return (model, d if d in P["head_dims"] else max(P["head_dims"]))


def _dispatch(P: dict, dtype, device) -> pd.DataFrame:
    """Which backend SDPA's default picks, at the seed's prefill length and at the largest decode batch."""
    native = [Architecture.from_model(m) for m in P["models"]]
    kv, batch = P["decode_kv_lens"][1], P["decode_batches"][-1]
    probe = [(f"prefill {SEED_COMPARISON_LENGTH:,}", AttentionShape.prefill(a, SEED_COMPARISON_LENGTH)) for a in native]
    probe += [(f"decode B={batch}, KV {kv:,}", AttentionShape.decode(a, kv, batch)) for a in native]
    return dispatch_table(probe, dtype, device)


def _sweeps(P: dict, dtype, device, roof) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Causal prefill (every model at every head dim), decode (each model at its own), masks; with rooflines."""
    archs = [Architecture.from_model(m, d) for m in P["models"] for d in P["head_dims"]]
    native = [Architecture.from_model(m) for m in P["models"]]
    kw = dict(
        dtype=dtype,
        device=device,
        policy=TimingPolicy(target_ms=P["target_ms"], max_repeats=P["max_repeats"], warmup=P["warmup"]),
        max_call_ms=P["max_call_ms"],
        progress=False,
        seed=P["seed"],
    )
    prefill = add_roofline(prefill_sweep(archs, P["prefill_lengths"], P["variants"], **kw), roof)
    decode = add_roofline(
        decode_sweep(
            native,
            P["decode_kv_lens"],
            P["decode_batches"],
            P["variants"],
            max_kv_bytes=int(P["max_kv_gib"] * 2**30),
            **kw,
        ),
        roof,
    )
    factories = mask_factories(P["window"], P["document_tokens"], P["seed"])
    masks = mask_sweep(Architecture.from_model(P["mask_model"]), P["mask_lengths"], factories, P["mask_variants"], **kw)
    return prefill, decode, add_roofline(masks, roof)


def run(P: dict) -> Run:
    """Measure everything the page shows, write every table and the findings, and finish the run record."""
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    import torch

    torch.manual_seed(P["seed"])  # anything drawn from torch's global generator; the inputs have their own (sweep)
    sdpa_order = priority_order()  # first: one SDPA call settles the order, so the device record holds the real one
    dev = device_record()
    ceil = measure_ceilings()
    roof = Roofline.from_ceilings(ceil)
    res = StudyResults(SLUG, dev, P, ceil)
    dtype, device = getattr(torch, P["dtype"]), ("cuda" if dev.kind == "cuda" else "cpu")
    dispatch = _dispatch(P, dtype, device)
    prefill, decode, masks = _sweeps(P, dtype, device, roof)
    batch = min(P["decode_batches"])
    found, problems = verdicts.findings(
        prefill, _primary(P), P["growth_pairs"], decode, decode_batch=batch, memory_method=memory.method(device)
    )
    r = Run(
        P=P,
        dev=dev,
        ceil=ceil,
        roof=roof,
        sdpa_order=sdpa_order,
        dispatch=dispatch,
        prefill=prefill,
        decode=decode,
        masks=masks,
        speedups=verdicts.speedup_vs_naive(prefill),
        growth=verdicts.memory_growth(prefill, P["growth_pairs"]),
        exponents=verdicts.growth_exponents(prefill),
        gqa=report.gqa_comparison(pd.concat([prefill, decode])),
        spread=verdicts.spreads(prefill, decode, decode_batch=batch),
        recommendations=recommend.recommend(
            recommend.regimes(prefill, decode, masks, long_from=P["long_from"], small_batch=P["small_batch"])
        ),
        findings=found,
        problems=problems,
    )
    for name in ("dispatch", "prefill", "decode", "masks", "gqa", "spread", "recommendations"):
        res.write(name, getattr(r, name))
    res.write("speedup_vs_naive", r.speedups)
    res.write("memory_growth", r.growth)
    res.write("memory_exponents", r.exponents)
    res.write_findings([f.row() for f in found])
    res.finish()
    return r


# ---- findings first --------------------------------------------------------------------------------------
def show_verdicts(r: Run) -> None:
    """The verdict table (seed value, this run's value, verdict, tested on), then any claim not judged."""
    show(verdict_table(r.findings), not_judged(r) or None)


def show_takeaways(r: Run) -> None:
    show(takeaways(r))


def takeaways(r: Run) -> str:
    """Three to five sentences, every number from the run."""
    return takeaway_list([_speedup_sentence(r), _memory_sentence(r), _decode_sentence(r), _mask_sentence(r)])


def headline_figure(r: Run):
    """The one figure: SDPA's default against naive attention, by length (F5.1), with the seed's point."""
    return plots.speedup(r.prefill, r.speedups, SEED_COMPARISON_LENGTH)


def _speedup_sentence(r: Run) -> str:
    at = r.speedups[r.speedups["q_len"].eq(SEED_COMPARISON_LENGTH)]
    if at.empty:
        return ""
    best = report.best_point(r.prefill, "pct_of_floor")
    return (
        f"At {SEED_COMPARISON_LENGTH:,} tokens SDPA's default is {at['speedup'].min():.1f}–{at['speedup'].max():.1f}× "
        f"faster than naive attention across the {len(at)} configurations (the RTX 2070: 7.64×). The closest any "
        f"kernel comes to the roofline floor is {best['pct_of_floor']:.0f}% ({best['variant']}, {best['arch']} "
        f"heads, D={best['head_dim']}, {best['q_len']:,} tokens): {best['achieved_tflop_s']:,.3g} TFLOP/s against "
        f"the {r.ceil.matmul_tflop_s:,.3g} TFLOP/s matmul ceiling."
    )


def _naive_oom_clause(r: Run) -> str:
    oom = report.first_failures(r.prefill, ("oom",))
    naive = oom[oom["variant"].eq("naive")]
    if naive.empty:
        return f"; naive attention fit in memory up to {max(r.P['prefill_lengths']):,} tokens on every configuration"
    return "; naive attention ran out of memory at " + ", ".join(
        f"{int(x.first_failure_len):,} tokens ({x.config}, after {x.peak_at_longest_ok_bytes / 1e9:,.1f} GB at "
        f"{int(x.longest_ok_len):,})"
        for x in naive.itertuples()
    )


def _memory_sentence(r: Run) -> str:
    g0 = r.growth[r.growth["short"].eq(r.growth["short"].min())] if len(r.growth) else r.growth
    if g0.empty or not {"naive", "sdpa_default"} <= set(g0["variant"]):
        return ""
    gv = g0.groupby("variant")["growth_incl_inputs"]
    exps = r.exponents
    return (
        f"From {int(g0['short'].min()):,} to {int(g0['long'].min()):,} tokens, naive attention's peak memory grows "
        f"{gv.min()['naive']:.0f}–{gv.max()['naive']:.0f}× and SDPA's default {gv.min()['sdpa_default']:.1f}–"
        f"{gv.max()['sdpa_default']:.1f}× (Q/K/V included; the RTX 2070: 25× and 2.4×). Fitted exponents: naive "
        f"{exps[exps['variant'].eq('naive')]['exponent'].median():.2f}, SDPA default "
        f"{exps[exps['variant'].eq('sdpa_default')]['exponent'].median():.2f}{_naive_oom_clause(r)}."
    )


def _decode_sentence(r: Run) -> str:
    if not r.decode["status"].eq("ok").any():
        return ""
    top = report.best_point(r.decode, "achieved_gb_s")
    dq = r.gqa[r.gqa["q_len"].eq(1)]
    text = (
        f"Decode is bandwidth-bound: the best decode point reads K and V at {top['achieved_gb_s']:,.0f} GB/s "
        f"({100 * top['achieved_gb_s'] / r.ceil.copy_gb_s:.0f}% of the {r.ceil.copy_gb_s:,.0f} GB/s copy ceiling; "
        f"{top['variant']}, {top['arch']}, batch {int(top['batch'])}, KV {int(top['kv_len']):,})."
    )
    if len(dq):
        text += (
            f" Repeating K/V heads instead of `enable_gqa` costs a median {dq['repeat_over_gqa'].median():.1f}× in "
            f"decode (range {dq['repeat_over_gqa'].min():.1f}–{dq['repeat_over_gqa'].max():.1f}×)."
        )
    return text


def _mask_sentence(r: Run) -> str:
    ok = r.masks[r.masks["status"].eq("ok")]
    mt = ok.pivot_table(index=["mask", "q_len"], columns="variant", values="median_ms")
    if not ({"flex", "sdpa_default"} <= set(mt.columns) and "sliding_window" in mt.index.get_level_values(0)):
        return ""
    sw = mt.loc["sliding_window"].dropna()
    if sw.empty:
        return ""
    n = int(sw.index.max())
    flex, dense = sw.loc[n, "flex"], sw.loc[n, "sdpa_default"]
    caveat = "" if r.dev.kind == "cuda" else " — on the CPU Flex runs unfused, so this ratio says nothing about the GPU"
    return (
        f"Sliding window at {n:,} tokens with a {r.P['window']:,}-token window: FlexAttention's block mask takes "
        f"{flex:.3g} ms and SDPA with the same window as a dense mask {dense:.3g} ms (dense / block: "
        f"{dense / flex:.3g}×){caveat}."
    )


def not_judged(r: Run) -> str:
    """Markdown naming each claim the data could not judge, and why (empty when all were judged)."""
    return takeaway_list(f"not judged: {p}" for p in r.problems) if r.problems else ""


# ---- method and details -----------------------------------------------------------------------------------
def setup(r: Run) -> str:
    """The device, the measured ceilings and SDPA's priority order, as the method section states them."""
    c = r.ceil
    text = (
        f"Device: {r.dev.summary()}. Profile {r.P['profile']}, {r.P['dtype']}; measured ceilings: copy "
        f"{c.copy_gb_s:,.0f} GB/s (read+write), {c.matmul_dtype} matmul {c.matmul_tflop_s:,.1f} TFLOP/s. SDPA backend "
        f"priority order (after a first call): {' > '.join(r.sdpa_order)}."
    )
    if r.dev.kind != "cuda":
        text += (
            " No CUDA device: SDPA's efficient and cuDNN backends are recorded as unsupported; FlexAttention runs "
            "its unfused eager path, checked for correctness but not timed; peak memory is counted by a tensor tracker."
        )
    return text


def show_dispatch(r: Run) -> None:
    cols = ["shape", "arch", "heads", "kv_heads", "head_dim", "priority", "picked", "ran", "agree", "kernels"]
    show(setup(r), r.dispatch[cols])


def show_prefill(r: Run) -> None:
    fails = report.first_failures(r.prefill, ("oom",))
    show(
        report.outcomes(r.prefill),
        "Out of memory:" if len(fails) else "No variant ran out of memory in this sweep.",
        fails if len(fails) else None,
        plots.prefill_time(r.prefill, r.roof),
        plots.prefill_tflops(r.prefill, r.ceil),
    )


def show_memory(r: Run) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory if r.dev.kind == "cuda" else None
    exps = r.exponents.pivot_table(index="variant", columns=["arch", "head_dim"], values="exponent").round(2)
    show(exps, plots.memory(r.prefill, total), plots.memory_growth_bars(r.growth) if len(r.growth) else None)


def show_decode(r: Run) -> None:
    show(report.outcomes(r.decode), plots.decode_bandwidth(r.decode, r.ceil), report.gqa_summary(r.gqa).round(2))


def show_roofline(r: Run) -> None:
    """Every timed prefill and decode call against the run's measured ceilings, with what to look for."""
    show(
        plots.roofline(r.prefill, r.decode, r.ceil, r.dev.name),
        "*Each timed attention call at its arithmetic intensity (FLOPs over the shape's minimum bytes: Q, K, V and "
        "the output read or written once), one colour per kernel. The dashed slope is the copy bandwidth measured in "
        "this run, the flat line its matmul rate; left of their meeting point a call is bound by memory, right of it "
        "by compute. The gap below the line is what a kernel leaves unused; a point above a line beat a measured "
        "ceiling, so its byte count is too low (data served from cache).*",
    )


def show_masks(r: Run) -> None:
    t = r.masks.pivot_table(index=["mask", "q_len"], columns="variant", values="median_ms").round(3)
    show(t, plots.masks(r.masks, r.roof))


def show_spread(r: Run) -> None:
    show(r.spread.round(2), plots.spread(r.spread))


def show_recommendations(r: Run) -> None:
    show(r.recommendations.round(2))


def show_finding_notes(r: Run) -> None:
    show(finding_notes(r.findings))


def rerun(r: Run) -> str:
    """The re-run recipe: the command, the notebook's parameters cell, the values this run used."""
    extra = [
        "# e.g. other mask lengths and decode batches:",
        f'papermill notebooks/{SLUG}.ipynb out.ipynb --cwd notebooks -p mask_lengths "[2048, 32768]" '
        '-p decode_batches "[1, 4, 16, 64, 256]"',
    ]
    return rerun_recipe(SLUG, r.P, extra=extra)


def published() -> str:
    """The "Against published results" section: the field's numbers beside this study's H200 ones, each cited
    (``data/published/published.csv``); where the CSV pairs none with this study, the section says so."""
    return render_published("05_attention")
