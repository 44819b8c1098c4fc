"""Study 2's measuring path: the machine's record and ceilings, every model's steps timed in every mode, and (on a
GPU) where one decode step's time goes. It writes raw tables only (``steps``, ``kernel_profile``, ``models``); every
derived table, the cost-model fits and the verdicts are the reporting path's (``report.py``).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pandas as pd

from servelab.bench.hf_modes import MODES
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.kernel_profile import profile_call
from servelab.measure.results import StudyResults
from servelab.models import ModelShape, load_model
from servelab.studies.common.quiet import quiet_profiler, quiet_run
from servelab.studies.s02_gpu_costs.points import study_plan
from servelab.studies.s02_gpu_costs.sweep import time_steps

STUDY = "02_gpu_costs"
PROFILE_BATCH, PROFILE_CONTEXT = 1, 512  # the decode step whose kernels are profiled (batch, cached tokens)
PARTS = {"all": 4.5}  # one part; minutes on the H200 before a run records its own


def _profile_decode(model, mode: str) -> dict:
    """One decode step (PROFILE_BATCH, PROFILE_CONTEXT) of ``mode`` under torch.profiler: kernels, GPU-busy share."""
    fn, before = MODES[mode](model, PROFILE_BATCH, 1, PROFILE_CONTEXT)

    def step():
        if before:
            before()
        fn()

    with quiet_profiler():
        kp = profile_call(step)
    return {k: v for k, v in kp.as_dict().items() if k != "top_kernels"}


def _time_model(spec: str, P: dict, dev, roof: Roofline) -> tuple[pd.DataFrame, list[dict], dict]:
    """One model's steps in every mode, its kernel profiles (CUDA only) and its size; the model is freed after."""
    import torch

    m = load_model(spec, dtype=P["dtype"], device=dev.kind, seed=P["seed"]).model
    shape = ModelShape.from_config(m.config)
    kv_token = shape.kv_bytes_per_token(m.dtype.itemsize)
    size = dict(
        model=spec,
        params_m=shape.params / 1e6,
        weight_gb_per_step=shape.weight_bytes(m.dtype.itemsize) / 1e9,
        kv_kib_per_token=kv_token / 1024,
    )
    steps = time_steps(
        m,
        spec,
        study_plan(P, kv_token),
        roof,
        repeats=P["repeats"],
        desc=spec,
        max_tokens={"engine_eager": P["engine_eager_max_tokens"]},
    )
    kprof = (
        [dict(model=spec, mode=mode, **_profile_decode(m, mode)) for mode in P["modes"]] if dev.kind == "cuda" else []
    )
    del m
    gc.collect()
    if dev.kind == "cuda":
        torch.cuda.empty_cache()
    return steps, kprof, size


def measure(P: dict) -> Path:
    """Measure the machine and time every model's steps in every mode; the run's folder.

    Library warnings that say nothing about the measurement are filtered (``common.quiet``)."""
    with quiet_run():
        dev = device_record()
        ceil = measure_ceilings()
        roof = Roofline.from_ceilings(ceil)
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        frames, kprof, sizes = [], [], []
        for spec in P["models"]:
            steps, kp, size = _time_model(spec, P, dev, roof)
            frames.append(steps)
            kprof += kp
            sizes.append(size)
        res.write("steps", pd.concat(frames, ignore_index=True))
        res.write("models", pd.DataFrame(sizes))
        if kprof:
            res.write("kernel_profile", pd.DataFrame(kprof))
        res.finish()
        return res.dir
