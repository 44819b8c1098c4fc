"""Study 4 end to end, as its notebook runs it: the machine's record and ceilings, bytes per token (F4.1), capacity
with and without paging, decode against context (F4.2), compaction bandwidth (F4.3) and compaction during decode
(F4.4), every table written to the run's results with the verdicts. One call (``run``), so that the notebook holds
parameters, this call, figures and findings only.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pandas as pd

from servelab.kv.pool import as_torch_dtype
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.models import load_model
from servelab.studies.common.findings import Finding
from servelab.studies.common.quiet import quiet_run
from servelab.studies.common.style import use_book_style
from servelab.studies.s04_kv_cache import verdicts
from servelab.studies.s04_kv_cache.bytes_per_token import KVGeometry, bytes_per_token_table, model_config
from servelab.studies.s04_kv_cache.capacity import LengthDistribution, capacity_table, fixed_length_capacity
from servelab.studies.s04_kv_cache.compaction_bench import compaction_sweep
from servelab.studies.s04_kv_cache.decode_scaling import decode_context_sweep, variation_summary
from servelab.studies.s04_kv_cache.overlap import build_rig, overlap_experiment, overlap_summary
from servelab.studies.s04_kv_cache.overlap_probes import clocks_by_condition, cold_start_effect, kernel_comparison

STUDY = "04_kv_cache"
FIXED_LENGTHS = (128, 512, 2048)  # tokens per sequence in the fixed-length capacity (with capacity_max_len)


@dataclass
class Capacity:
    bytes_per_token: int  # of the capacity model's KV, at capacity_dtype
    source: str  # where the request lengths come from (an assumption, stated)
    table: pd.DataFrame  # capacity_table: every trial, phase, layout and block size
    fixed: pd.DataFrame  # fixed_length_capacity
    summary: pd.DataFrame  # medians over trials per phase, layout and block size


@dataclass
class Overlap:
    runs: pd.DataFrame  # every round of every condition, per decode batch
    summary: pd.DataFrame  # overlap_summary plus the rig's info, one row per decode batch
    kernels: pd.DataFrame  # kernel_comparison (CUDA only; else empty)
    clocks: pd.DataFrame  # clocks_by_condition (CUDA only; else empty)
    cold: pd.DataFrame | None  # cold_start_effect (CUDA only)


@dataclass
class Study4Run:
    P: dict
    dev: object  # servelab.measure.DeviceRecord
    ceilings: object  # servelab.measure.Ceilings
    bpt: pd.DataFrame  # bytes_per_token_table
    capacity: Capacity
    kv_kib_per_token: float  # the decode model's, at its dtype
    decode_steps: pd.DataFrame
    variation: pd.DataFrame  # variation_summary
    compaction: pd.DataFrame  # compaction_sweep
    element_bytes: int  # the decode model's dtype size (bytes): gather/scatter's element size
    overlap: Overlap
    findings: list[Finding]
    results_dir: object = None


def measure_capacity(P: dict) -> Capacity:
    geom = KVGeometry.from_config(model_config(P["capacity_model"]))
    bpt = geom.kv_bytes_per_token(as_torch_dtype(P["capacity_dtype"]).itemsize)
    dist = LengthDistribution(max_len=P["capacity_max_len"])
    budget = P["capacity_budget_gib"] * 2**30
    cap = capacity_table(bpt, budget, dist, P["block_sizes"], trials=P["capacity_trials"])
    lengths = [*FIXED_LENGTHS, P["capacity_max_len"]]
    fixed = fixed_length_capacity(bpt, budget, lengths, P["capacity_max_len"], P["block_sizes"][0])
    summary = (
        cap.groupby(["phase", "layout", "block_size"])[["sequences", "fragmentation_pct", "budget_used_pct"]]
        .median()
        .reset_index()
    )
    return Capacity(bpt, dist.source, cap, fixed, summary)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def measure_overlap(model, P: dict, on_cuda: bool) -> Overlap:
    """F4.4 once per decode batch: the interleaved conditions, and on a GPU the kernel, clock and cold-start probes."""
    runs, summaries, kernels, clocks, cold = [], [], [], [], None
    for batch in P["overlap_batches"]:
        rig, info = build_rig(
            model,
            batch=batch,
            context=P["overlap_context"],
            pool_mib=P["overlap_pool_mib"],
            block_size=P["overlap_block_size"],
            move_fraction=P["overlap_move_fraction"],
        )
        r = overlap_experiment(rig, rounds=P["overlap_rounds"]).assign(decode_batch=batch)
        runs.append(r)
        summaries.append({**info, **overlap_summary(r)})
        if on_cuda:
            kernels.append(kernel_comparison(rig).assign(decode_batch=batch))
            clocks.append(clocks_by_condition(rig).assign(decode_batch=batch))
            if cold is None:  # once: does starting from an idle GPU change "compaction alone"?
                cold = cold_start_effect(rig).assign(decode_batch=batch)
        del rig
        gc.collect()
    return Overlap(_concat(runs), pd.DataFrame(summaries), _concat(kernels), _concat(clocks), cold)


def _write(res: StudyResults, r: Study4Run) -> None:
    P, cap, ov = r.P, r.capacity, r.overlap
    res.write("bytes_per_token", r.bpt)
    res.write("capacity", cap.table.assign(model=P["capacity_model"], length_source=cap.source))
    res.write("capacity_fixed_length", cap.fixed.assign(model=P["capacity_model"]))
    res.write("decode_steps", r.decode_steps)
    res.write("decode_variation", r.variation)
    res.write("compaction", r.compaction)
    res.write("overlap_runs", ov.runs)
    res.write("overlap_summary", ov.summary)
    if not ov.kernels.empty:
        res.write("overlap_kernels", ov.kernels)
        res.write("overlap_clocks", ov.clocks)
        res.write("overlap_cold_start", ov.cold)
    res.write_findings([f.row() for f in r.findings])


def run(P: dict) -> Study4Run:
    """Measure everything the page shows, write every table and the findings.

    Library warnings that say nothing about the measurement are filtered (``common.quiet``).
    """
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    with quiet_run():
        return _run(P)


def _run(P: dict) -> Study4Run:
    dev = device_record()
    ceil = measure_ceilings()
    res = StudyResults(STUDY, dev, P, ceil)
    on_cuda = dev.kind == "cuda"
    bpt = bytes_per_token_table(P["bpt_cases"], dev.kind)
    capacity = measure_capacity(P)
    model = load_model(P["decode_model"], dtype=P["decode_dtype"], device=dev.kind, seed=P["seed"]).model
    geom = KVGeometry.from_config(model.config)
    steps = decode_context_sweep(
        model,
        P["decode_model"],
        P["decode_modes"],
        P["decode_batches"],
        P["decode_contexts"],
        Roofline.from_ceilings(ceil),
        repeats=P["repeats"],
    )
    variation = variation_summary(steps)
    comp = compaction_sweep(
        geom.layers,
        geom.kv_heads,
        geom.head_dim,
        model.dtype,
        dev.kind,
        block_sizes=P["block_sizes"],
        pool_mib=P["compaction_pool_mib"],
        move_fractions=P["compaction_move_fractions"],
        methods=P["compaction_methods"],
        copy_gb_s=ceil.copy_gb_s,
        repeats=P["repeats"],
    )
    overlap = measure_overlap(model, P, on_cuda)
    findings = verdicts.findings(
        bpt,
        variation,
        comp,
        overlap.summary,
        copy_gb_s=ceil.copy_gb_s,
        on_cuda=on_cuda,
        model=P["decode_model"],
        dtype=P["decode_dtype"],
    )
    kib = geom.kv_bytes_per_token(model.dtype.itemsize) / 1024
    r = Study4Run(
        P, dev, ceil, bpt, capacity, kib, steps, variation, comp, model.dtype.itemsize, overlap, findings, res.dir
    )
    del model
    gc.collect()
    _write(res, r)
    res.finish()
    return r
