"""Study 2 end to end, as its notebook runs it: the machine's record and ceilings, every model's steps timed in every
mode (and, on a GPU, where one decode step's time goes), the derived tables, the fitted cost models, the verdicts,
all written to the run's results. One call (``run``), so that the notebook holds parameters, this call, figures and
findings only.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pandas as pd

from servelab.bench.hf_modes import MODES
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.kernel_profile import profile_call
from servelab.measure.results import StudyResults
from servelab.models import ModelShape, load_model
from servelab.sim.cost_fit import fit_all, heldout_table
from servelab.studies.common.findings import Finding
from servelab.studies.common.quiet import quiet_profiler, quiet_run
from servelab.studies.common.style import use_book_style
from servelab.studies.s02_gpu_costs import verdicts
from servelab.studies.s02_gpu_costs.launch_overhead import launch_overhead
from servelab.studies.s02_gpu_costs.points import study_plan
from servelab.studies.s02_gpu_costs.sweep import time_steps

STUDY = "02_gpu_costs"
PROFILE_BATCH, PROFILE_CONTEXT = 1, 512  # the decode step whose kernels are profiled (batch, cached tokens)
SERVER_STEP_COLUMNS = [
    "model",
    "mode",
    "phase",
    "batch",
    "new_tokens",
    "context",
    "decodes",
    "decode_context",
    "path",
    "median_ms",
    "p25_ms",
    "p75_ms",
    "floor_ms",
    "pct_of_floor",
]


@dataclass
class Study2Run:
    P: dict
    dev: object  # servelab.measure.DeviceRecord
    ceilings: object  # servelab.measure.Ceilings
    models: pd.DataFrame  # per model: parameters (M), weight GB read per step, KV KiB/token
    steps: pd.DataFrame  # every timed step (``time_steps`` rows)
    kernel_profile: pd.DataFrame  # per model and mode, one decode step under torch.profiler (empty on a CPU)
    modes: pd.DataFrame  # the same decode step (batch 1, shortest context) in each mode, against its floor
    server_steps: pd.DataFrame  # the engine's chunks after context and mixed steps
    overhead: pd.DataFrame  # ``launch_overhead``: each step run with and without graphs
    cost_fit: pd.DataFrame  # ``fit_all``'s summary per model and mode
    heldout: pd.DataFrame  # ``heldout_table``
    predicted: pd.DataFrame  # measured and predicted step times
    findings: list[Finding]
    results_dir: object = None


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


def _modes_table(steps: pd.DataFrame) -> pd.DataFrame:
    dec = steps[(steps.status == "ok") & (steps.phase == "decode")]
    first = dec[(dec.batch == 1) & (dec.context == dec.context.min())]
    cols = ["model", "mode", "context", "median_ms", "p25_ms", "p75_ms", "floor_ms", "pct_of_floor"]
    return first[cols].assign(times_floor=lambda t: t.median_ms / t.floor_ms)


def _server_steps(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[
        (steps.status == "ok")
        & steps["mode"].isin(["engine", "engine_eager"])
        & ((steps.phase == "mixed") | ((steps.phase == "prefill") & (steps.context > 0)))
    ]


def run(P: dict) -> Study2Run:
    """Measure the machine, time every model, derive the tables and cost models, write them and the findings.

    Library warnings that say nothing about the measurement are filtered (``common.quiet``).
    """
    use_book_style()  # SVG figures, type readable at page width, before any figure is drawn
    with quiet_run():
        return _run(P)


def _run(P: dict) -> Study2Run:
    dev = device_record()
    ceil = measure_ceilings()
    roof = Roofline.from_ceilings(ceil)
    res = StudyResults(STUDY, dev, P, ceil)
    frames, kprof, sizes = [], [], []
    for spec in P["models"]:
        steps, kp, size = _time_model(spec, P, dev, roof)
        frames.append(steps)
        kprof += kp
        sizes.append(size)
    steps = pd.concat(frames, ignore_index=True)
    res.write("steps", steps)
    kernel_profile = pd.DataFrame(kprof)
    if kprof:
        res.write("kernel_profile", kernel_profile)
    modes, server, overhead = _modes_table(steps), _server_steps(steps), launch_overhead(steps)
    res.write("modes", modes)
    res.write("server_steps", server)
    res.write("launch_overhead", overhead)
    cms, predicted, fit_summary = fit_all(steps)
    for (m, mode), cm in cms.items():
        res.write_json(f"cost_model_{m.replace(':', '_')}_{mode}", cm.__dict__)
    res.write("cost_model_fit", fit_summary)
    heldout = heldout_table(predicted)
    res.write("cost_model_heldout", heldout)
    findings = verdicts.findings(steps, P["dtype"])
    res.write_findings([f.row() for f in findings])
    res.finish()
    return Study2Run(
        P, dev, ceil, pd.DataFrame(sizes), steps, kernel_profile, modes, server, overhead, fit_summary, heldout,
        predicted, findings, res.dir,
    )  # fmt: skip
