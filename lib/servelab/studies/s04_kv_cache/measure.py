"""Study 4's measuring path: the machine's record and ceilings; bytes per token (F4.1); sequences that fit a budget
with and without paging (the real block manager, filled with sampled lengths); decode against context (F4.2, timed by
Study 2's sweep); compaction bandwidth (F4.3); compaction during decode (F4.4) and, on a GPU, its kernel, clock and
cold-start probes. It writes raw tables only; the variation over context, the overlap's summary with its intervals,
the capacity medians and the verdicts are the reporting path's (``report.py``, ``derived.py``).

Every random choice (weights, request lengths, fragmented pools, the order of the overlap's conditions) derives from
``P["seed"]``, so repeats are independent.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pandas as pd

from servelab.kv.pool import as_torch_dtype
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.models import load_model
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s04_kv_cache.bytes_per_token import KVGeometry, bytes_per_token_table, model_config
from servelab.studies.s04_kv_cache.capacity import LengthDistribution, capacity_table, fixed_length_capacity
from servelab.studies.s04_kv_cache.compaction_bench import compaction_sweep
from servelab.studies.s04_kv_cache.decode_scaling import decode_context_sweep
from servelab.studies.s04_kv_cache.overlap import build_rig, overlap_experiment
from servelab.studies.s04_kv_cache.overlap_probes import clocks_by_condition, cold_start_effect, kernel_comparison

STUDY = "04_kv_cache"
PARTS = {"all": 2.0}  # one part; minutes on the H200 (the legacy run took 69 s) before a run records its own
FIXED_LENGTHS = (128, 512, 2048)  # tokens per sequence in the fixed-length capacity (with capacity_max_len)


def measure_capacity(P: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every trial of filling the budget (contiguous, and paged at each block size), and the fixed-length counts."""
    geom = KVGeometry.from_config(model_config(P["capacity_model"]))
    bpt = geom.kv_bytes_per_token(as_torch_dtype(P["capacity_dtype"]).itemsize)
    dist = LengthDistribution(max_len=P["capacity_max_len"])
    budget = P["capacity_budget_gib"] * 2**30
    cap = capacity_table(bpt, budget, dist, P["block_sizes"], trials=P["capacity_trials"], seed=P["seed"])
    lengths = [*FIXED_LENGTHS, P["capacity_max_len"]]
    fixed = fixed_length_capacity(bpt, budget, lengths, P["capacity_max_len"], P["block_sizes"][0])
    return (
        cap.assign(model=P["capacity_model"], length_source=dist.source),
        fixed.assign(model=P["capacity_model"]),
    )


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def measure_overlap(model, P: dict, on_cuda: bool) -> dict[str, pd.DataFrame]:
    """F4.4 once per decode batch: the rig (``overlap_rig``), every round of the interleaved conditions
    (``overlap_runs``), and on a GPU the kernel, clock and cold-start probes."""
    runs, rigs, kernels, clocks, cold = [], [], [], [], []
    for batch in P["overlap_batches"]:
        rig, info = build_rig(
            model,
            batch=batch,
            context=P["overlap_context"],
            pool_mib=P["overlap_pool_mib"],
            block_size=P["overlap_block_size"],
            move_fraction=P["overlap_move_fraction"],
            seed=P["seed"],
        )
        runs.append(overlap_experiment(rig, rounds=P["overlap_rounds"], seed=P["seed"]).assign(decode_batch=batch))
        rigs.append(info)
        if on_cuda:
            kernels.append(kernel_comparison(rig).assign(decode_batch=batch))
            clocks.append(clocks_by_condition(rig).assign(decode_batch=batch))
            if not cold:  # once: does starting from an idle GPU change "compaction alone"?
                cold.append(cold_start_effect(rig).assign(decode_batch=batch))
        del rig
        gc.collect()
    return {
        "overlap_rig": pd.DataFrame(rigs),
        "overlap_runs": _concat(runs),
        "overlap_kernels": _concat(kernels),
        "overlap_clocks": _concat(clocks),
        "overlap_cold_start": _concat(cold),
    }


def measure(P: dict) -> Path:
    """Measure everything the page shows; the run's folder.

    Library warnings that say nothing about the measurement are filtered (``common.quiet``)."""
    with quiet_run():
        dev = device_record()
        ceil = measure_ceilings()
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        on_cuda = dev.kind == "cuda"
        res.write("bytes_per_token", bytes_per_token_table(P["bpt_cases"], dev.kind))
        cap, fixed = measure_capacity(P)
        res.write("capacity", cap)
        res.write("capacity_fixed_length", fixed)
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
        res.write("decode_steps", steps)
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
            seed=P["seed"],
        )
        res.write("compaction", comp)
        for name, df in measure_overlap(model, P, on_cuda).items():
            if not df.empty:
                res.write(name, df)
        del model
        gc.collect()
        res.finish()
        return res.dir
