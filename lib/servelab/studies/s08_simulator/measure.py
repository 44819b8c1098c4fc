"""The simulator study's measuring path: what needs the GPU or the run's own host, as raw tables.

- ``fresh_<model>`` parts (issue 27, item 5): the cost-model code's hash is recorded against the freeze
  (``freeze_check.json``: ``data/validation/sim_freeze.json``'s hash and today's), then a real server run of Study 1's
  sweep on the GPU with the registered fresh spec's seed and rate fractions (``data/validation/<fresh_run>.yaml``;
  none of them was used in calibration): its raw request records and step log (``fresh_requests``, ``fresh_steps``,
  ``fresh_summary``), the parameters it ran with (``fresh_params.json``) and which spec and seed it used
  (``fresh_seed.json``: the spec's seed + this run's ``seed``; only offset 0 is the seed the ledger registered).
  The report replays it once on the frozen cost models;
- ``speed``: the wall time of the simulator on this host for ``speed_duration_s`` simulated seconds at
  ``speed_rate`` req/s over ``speed_replicas`` replicas (``sim_speed``), on the frozen cost model of Study 1's
  first model and Study 1's request lengths. A wall time cannot be recomputed from files: it is measured here only.

Part ``all`` (a notebook's run) does both, every model of Study 1's profile. Calibration, validation, the Study 7
replay, capacity and routing are the reporting path's (``report.py``), from the other studies' files.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from servelab.errors import ParameterError
from servelab.measure import Roofline, device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s08_simulator import freeze_record, speed

STUDY = "08_simulator"
FRESH_MODELS = {"fresh_qwen2-0.5b": "config:qwen2-0.5b", "fresh_llama-3-8b": "config:llama-3-8b"}
# minutes on the H200 before a run records its own: each model's Study 1 points within its time budget, and the hour
PARTS = {"fresh_qwen2-0.5b": 5.0, "fresh_llama-3-8b": 7.0, "speed": 1.5}


def fresh_spec(run_id: str, root: Path = freeze_record.VALIDATION_DIR) -> dict:
    """The registered fresh run's spec (notebook 01's parameters): an integer seed and a list of rate fractions."""
    path = Path(root) / f"{run_id}.yaml"
    if not path.is_file():
        raise ParameterError(f"no spec for fresh run {run_id!r} at {path}")
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or isinstance(spec.get("seed"), bool) or not isinstance(spec.get("seed"), int):
        raise ParameterError(f"{path}: a fresh run's spec sets an integer seed")
    fr = spec.get("rate_fractions")
    if not isinstance(fr, list) or not fr or not all(isinstance(x, (int, float)) and x > 0 for x in fr):
        raise ParameterError(f"{path}: rate_fractions must be a non-empty list of positive numbers, got {fr!r}")
    return spec


STUDY1_RUN = re.compile(r"/01_scheduling/runs/([0-9a-f]+)/")  # a calibration input's folder names its fingerprint


def freeze_check(root: Path = freeze_record.VALIDATION_DIR) -> dict:
    """The cost-model code's hash now against the freeze's: a fresh run tests the frozen model only if they match."""
    try:
        rec = freeze_record.load_freeze(root)
    except ParameterError:
        rec = None
    code = freeze_record.code_hashes()
    now = freeze_record.combined_sha256(code)
    return {
        "code_sha256": now,
        "frozen_code_sha256": rec["code"]["sha256"] if rec else None,
        "frozen_utc": rec["frozen_utc"] if rec else None,
        "matches_freeze": bool(rec) and now == rec["code"]["sha256"],
        "changed_files": freeze_record.changed_files(rec) if rec else sorted(code),
    }


def engine_check(root: Path = freeze_record.VALIDATION_DIR) -> dict:
    """Study 1's measuring fingerprint now (its server and engine) against that of the runs the freeze calibrated
    on: a fresh run measures today's engine, and the frozen model priced the calibration runs' engine, so where the
    two differ the run's error would hold the engine's change as well as the model's (issue 29 changed the step)."""
    from servelab.measure.fingerprint import fingerprint

    try:
        rec = freeze_record.load_freeze(root)
    except ParameterError:
        rec = None
    calibrated = sorted({m.group(1) for p in (rec or {}).get("calibration_inputs", {}) if (m := STUDY1_RUN.search(p))})
    now = fingerprint("servelab.studies.s01_scheduling.measure").short
    return {"study1_fingerprint": now, "calibrated_on": calibrated, "matches": calibrated == [now]}


def held_back(part: str) -> str:
    """Why a job of ``part`` cannot give valid data yet, "" where it can (``campaign`` asks every measuring module
    that has this): a fresh held-out run tests the frozen cost model only while the model's code is the freeze's,
    and only on the engine its calibration runs measured."""
    if not part.startswith("fresh_"):
        return ""
    check = freeze_check()
    if not check["matches_freeze"]:
        files = ", ".join(check["changed_files"]) or "no freeze recorded"
        return f"the simulator's cost-model code differs from its freeze ({files}): freeze again first"
    engine = engine_check()
    if not engine["matches"]:
        return (
            f"Study 1's engine ({engine['study1_fingerprint']}) is not the one the freeze calibrated on "
            f"({', '.join(engine['calibrated_on']) or 'none recorded'}): run the fresh repeats from a snapshot of "
            "that code (scripts/gpu_snapshot.sh), or freeze again on Study 1's new runs and draw a new fresh run"
        )
    return ""


def seed_record(P: dict, root: Path = freeze_record.VALIDATION_DIR) -> dict:
    """Which registered spec and seed a fresh run used: the spec's seed moved by this run's ``seed`` (repeat r of a
    campaign: + r), so only a run with ``P["seed"] == 0`` runs the seed the ledger registered for that spec."""
    path = Path(root) / f"{P['fresh_run']}.yaml"
    spec = fresh_spec(P["fresh_run"], root)
    return {
        "fresh_run": P["fresh_run"],
        "spec_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "spec_seed": spec["seed"],
        "seed_offset": P["seed"],
        "seed": spec["seed"] + P["seed"],
        "rate_fractions": [float(x) for x in spec["rate_fractions"]],
    }


def study1_params(P: dict, models: list[str] | None) -> dict:
    """Study 1's parameters for the fresh run: its profile, the spec's rate fractions and seed (moved by this run's
    seed, so that repeats are independent), no budget sweep, the part's models and time budget."""
    from servelab.studies.s01_scheduling.params import study_params

    spec = fresh_spec(P["fresh_run"])
    over = {k: v for k, v in spec.items() if k not in ("seed", "rate_fractions")}
    over.update(
        seed=spec["seed"] + P["seed"],
        rate_fractions=[float(x) for x in spec["rate_fractions"]],
        time_budget_s=P["fresh_time_budget_s"],
    )
    if models:
        over["models"] = list(models)
    return study_params(P["profile"], **over)


def _fresh(res: StudyResults, P: dict, dev, ceil, models: list[str] | None) -> None:
    from servelab.studies.s01_scheduling.sweep import run_study

    res.write_json("freeze_check", freeze_check())
    res.write_json("fresh_seed", seed_record(P))  # the ledger's spec and the seed this run used
    P1 = study1_params(P, models)
    log: list[str] = []
    data = run_study(
        P1,
        tempfile.mkdtemp(prefix="study08-fresh-"),
        device="cuda" if dev.kind == "cuda" else "cpu",
        roofline=Roofline.from_ceilings(ceil),
        progress=False,
        log=log.append,
    )
    frames = data.frames()
    for name in ("requests", "steps", "summary"):
        if not frames[name].empty:
            res.write(f"fresh_{name}", frames[name])
    # the server ran its step graphs on CUDA (``serve --step-graphs``): the replay prices their padding
    res.write_json("fresh_params", {**P1, "step_graphs": dev.kind == "cuda", "fresh_run": P["fresh_run"]})
    res.write_json("fresh_log", log)


def _speed(res: StudyResults, P: dict) -> None:
    from servelab.studies.s01_scheduling.params import study_params
    from servelab.studies.s01_scheduling.sweep import workload_lengths
    from servelab.studies.s08_simulator.study1_runs import server_limits, sim_kwargs_for

    rec = freeze_record.load_freeze()
    models = freeze_record.frozen_models(rec)
    P1 = study_params("full")  # the server's limits and request lengths the simulator runs on
    model = next(m for m in P1["models"] if m in models)
    sched = sim_kwargs_for(server_limits({**P1, "step_graphs": True}))({"scheduler": "chunked_prefill", "budget": None})
    row = speed.simulator_speed(
        workload_lengths(P1),
        cost=models[model],
        rate=P["speed_rate"],
        duration_s=P["speed_duration_s"],
        replicas=P["speed_replicas"],
        seed=P["seed"],
        progress=False,
        **sched,
    )
    res.write("sim_speed", pd.DataFrame([{**row, "cost_model": model}]))


def measure(P: dict) -> Path:
    """The fresh held-out run and/or the simulator's speed (``P["part"]``); the run's folder."""
    part = P.get("part", "all")
    if part not in (*PARTS, "all"):
        raise ParameterError(f"part must be one of {[*PARTS, 'all']}, got {part!r}")
    with quiet_run():
        dev = device_record()
        ceil = measure_ceilings()
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        if part.startswith("fresh") or part == "all":
            models = P["fresh_models"] or ([FRESH_MODELS[part]] if part in FRESH_MODELS else None)
            _fresh(res, P, dev, ceil, models)
        if part in ("speed", "all"):
            _speed(res, P)
        res.finish()
        return res.dir
