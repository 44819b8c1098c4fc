"""The reporting path's inputs from the other studies' runs (``common.runs.study_runs``), read from files only.

- ``study1``: Study 1's requests and steps of one whole repeat and its parameters (the runs the simulator is
  calibrated on and validated against; ``study1_runs`` says which);
- ``study2_steps`` and ``gpu_cost_model``: Study 2's timed steps (every point's median over repeats) and the cost
  model fitted from them at render time (``servelab.sim.cost_fit.fit_all``), priced for context reads;

Runs of the old flat layout (the legacy run of each study) are read alike: the raw tables keep their names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.sim.cost_fit import fit_all
from servelab.sim.cost_model import StepCostModel
from servelab.studies.common.runs import RunSet, pool_repeats, study_runs
from servelab.studies.s08_simulator.context_reads import with_context_reads
from servelab.studies.s08_simulator.ledger import file_sha256

STUDY1, STUDY2, STUDY7 = "01_scheduling", "02_gpu_costs", "07_prefix_cache"
# what identifies one timed step of Study 2 (its report's keys): the median over repeats is the value fitted
STEP_KEYS = ["model", "mode", "phase", "batch", "new_tokens", "context", "decodes", "decode_context", "path"]


def runs_of(study: str, root: Path | None) -> RunSet:
    """The runs of another study that the page reads, under the same results root as the page's own runs."""
    return study_runs(study, root)


def _with_graphs(meta: dict) -> dict:
    params = dict(meta.get("params") or {})
    # the server replays captured step graphs on CUDA unless told otherwise (``serve --step-graphs``, default on)
    params.setdefault("step_graphs", (meta.get("device") or {}).get("kind") == "cuda")
    return params


def _slug(rep: RunSet) -> str:
    """The device slug of a run: its ``run.json``'s, else its folder's (``<device>/<study>/runs/<fp>/<part>/r<k>``)."""
    slug = (rep.meta.get("device") or {}).get("slug")
    return str(slug) if slug else (rep.runs[0].dir.parents[4].name if rep.runs else "")


@dataclass
class Study1:
    requests: pd.DataFrame
    steps: pd.DataFrame
    params: dict
    slug: str  # the device's
    commit: str
    repeat: int
    repeats: int  # how many repeats Study 1 has (the page replays one)
    legacy: bool


def study1_runs(root: Path | None) -> RunSet:
    """Study 1's runs the simulator replays: its repeats that measured every part (``RunSet.complete``). While
    today's Study 1 is still measured part by part, that is the last fingerprint with a whole repeat (the legacy
    run): a calibration on one part (one model, one policy) would be a different simulator, not a newer one."""
    from servelab.studies.s01_scheduling.measure import PARTS

    return runs_of(STUDY1, root).complete(PARTS)


def study1(root: Path | None) -> Study1 | None:
    """Study 1's first whole repeat (``study1_runs``): its request records and step log (every part of it) and its
    parameters; None where it has no request records or no step log."""
    runs = study1_runs(root)
    if not runs.measured:
        return None
    return study1_repeat(runs, runs.repeats[0])


def study1_repeat(runs: RunSet, index: int) -> Study1 | None:
    """Repeat ``index`` of Study 1's runs (``runs``), as ``study1`` reads the first; None where it has no request
    records or no step log."""
    rep = runs.repeat(index)
    requests = rep.table("requests", keep_default_na=False, na_values=[""])
    steps = rep.table("steps")
    if requests.empty or steps.empty:
        return None
    requests = requests.drop(columns=[c for c in ("part", "repeat") if c in requests.columns])
    steps = steps.drop(columns=[c for c in ("part", "repeat") if c in steps.columns])
    if "error" in requests.columns:
        requests["error"] = requests["error"].fillna("")
    return Study1(
        requests,
        steps,
        _with_graphs(rep.meta),
        _slug(rep),
        str(rep.meta.get("git_commit", "")),
        index,
        len(runs.repeats),
        runs.fingerprint == "legacy",
    )


def study1_requests_sha256(root: Path | None, index: int | None = None) -> str | None:
    """Repeat ``index`` (default: the first) of Study 1's request records as one hash, the ledger's name for that
    data: its one file's SHA-256 where it has one (so that a run's data keeps its hash in any layout), else the hash
    of its files' hashes in order; None where it has none."""
    runs = study1_runs(root)
    if not runs.measured:
        return None
    rep = runs.repeat(runs.repeats[0] if index is None else index)
    shas = [file_sha256(r.dir / "requests.csv") for r in rep.runs if (r.dir / "requests.csv").is_file()]
    if not shas:
        return None
    return shas[0] if len(shas) == 1 else hashlib.sha256("".join(shas).encode()).hexdigest()


def study2_steps(root: Path | None) -> pd.DataFrame | None:
    """Study 2's timed steps, each point's median over its repeats; None where it has none."""
    runs = runs_of(STUDY2, root)
    steps = runs.table("steps") if runs.measured else pd.DataFrame()
    if steps.empty:
        return None
    return pool_repeats(steps, STEP_KEYS) if "repeat" in steps else steps


def fitted_gpu_models(steps: pd.DataFrame | None) -> dict:
    """Study 2's cost models fitted from its steps (``fit_all``), keyed by ``(model, mode)``."""
    if steps is None or steps.empty:
        return {}
    return fit_all(steps)[0]


def gpu_cost_model(
    model: str, modes: list[str], steps: pd.DataFrame | None, fits: dict, *, context_reads: bool = True
) -> tuple[StepCostModel, str] | None:
    """Study 2's cost model of ``model`` in the first of ``modes`` it fitted, priced for the context its chunks
    and decodes read (``context_reads``) unless told not to; ``(model, mode)`` or None."""
    stem = model.replace(":", "_").replace("/", "_")
    for mode in modes:
        cm = fits.get((model, mode))
        if cm is None:
            continue
        base = StepCostModel(gpu=cm, source=f"Study 2: cost_model_{stem}_{mode} (fitted from its steps)")
        return (with_context_reads(base, steps, model, mode)[0] if context_reads else base), mode
    return None
