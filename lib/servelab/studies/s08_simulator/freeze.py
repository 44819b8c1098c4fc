"""Freeze the simulator's cost model: its code's hashes, its calibration inputs, its fitted coefficients, its error.

``python -m servelab.studies.s08_simulator.freeze`` fits the cost model the page fits (``validation.validation_table``
on Study 1's first repeat, Study 2's cost models fitted from its steps, both read as the report reads them:
``sources``) and writes the record ``freeze_record.py`` describes, ``data/validation/sim_freeze.json``.

A fresh run (``heldout.py``; the measuring path's ``fresh_*`` parts) is then drawn after the freeze and evaluated
once. Freezing again (``--replace``) after a change to the model voids every registration made before it: a new
fresh run is needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure.results import git_commit, results_root
from servelab.paths import REPO_ROOT
from servelab.studies.s08_simulator import ledger, sources, study1_runs, validation
from servelab.studies.s08_simulator.freeze_record import (
    FIT,
    FREEZE_FILE,
    LEDGER_FILE,
    MODEL_FILES,
    VALIDATION_DIR,
    _rel,
    code_hashes,
    combined_sha256,
    utc_now,
)


def _calibration_inputs(results: Path | None, s1: sources.Study1, repo: Path) -> dict[str, str]:
    """SHA-256 of every file the fit read: the Study 1 repeat's request records, step logs and ``run.json``s, and
    Study 2's step logs (its cost models are fitted from them, as the page fits them)."""
    s1runs = sources.study1_runs(results).repeat(s1.repeat)
    files = [r.file(n) for r in s1runs.runs for n in ("requests.csv", "steps.csv", "run.json")]
    files += [r.file("steps.csv") for r in sources.runs_of(sources.STUDY2, results).runs]
    return {_rel(f, repo): ledger.file_sha256(f) for f in files if f.is_file()}


def _error(table: pd.DataFrame, subset: str) -> tuple[float, dict[str, float], int]:
    """Median |error| (%) of the ``gpu+overheads`` model on a subset: over all metrics, per metric, and its runs."""
    t = table[(table["cost_model"] == "gpu+overheads") & (table["subset"] == subset)].dropna(subset=["error_pct"])
    a = t["error_pct"].abs()
    per = a.groupby(t["metric"]).median()
    runs = len(t.drop_duplicates(subset=validation.RUN_KEYS)) if len(t) else 0
    return float(a.median()), {k: float(v) for k, v in per.items()}, runs


def _fit(results: Path | None, every: int, cost_modes: list[str]) -> tuple[pd.DataFrame, dict, sources.Study1]:
    """Study 1's first repeat under ``results`` replayed as the page does (``report``: Study 2's cost models fitted
    from its steps, priced for context reads): ``(table, fitted, Study 1's repeat)``."""
    s1 = sources.study1(results)
    if s1 is None:
        raise ParameterError(f"no Study 1 runs (requests, steps) under {results or results_root()}")
    steps2 = sources.study2_steps(results)
    fits = sources.fitted_gpu_models(steps2)
    gpu = {}
    for m in sorted(s1.requests["model"].unique()):
        found = sources.gpu_cost_model(m, cost_modes, steps2, fits)
        gpu[m] = found[0] if found else None
    p = s1.params
    deadline = p["window_s"] + p["drain_s"] if {"window_s", "drain_s"} <= set(p) else None
    table, calib, fitted = validation.validation_table(
        s1.requests,
        s1.steps,
        gpu,
        sim_kwargs=study1_runs.sim_kwargs_for(study1_runs.server_limits(p)),
        every=every,
        outputs_for=study1_runs.requested_outputs_for(p),
        deadline_s=deadline,
    )
    bad = calib[calib["status"] != "ok"] if "status" in calib else calib.iloc[0:0]
    if len(bad) or not fitted:
        raise ParameterError(f"the cost model could not be fitted: {bad.to_dict('records') or 'no model'}")
    return table, fitted, s1


def freeze(
    *,
    root: Path = VALIDATION_DIR,
    results: Path | None = None,
    repo: Path = REPO_ROOT,
    files=MODEL_FILES,
    replace: bool = False,
    every: int | None = None,
    cost_modes: list[str] | None = None,
) -> dict:
    """Fit, save and record the frozen cost model (see the module's docstring); the record written.

    ``results``: the results root holding Study 1's runs (default: ``$SERVELAB_RESULTS`` or ``data/results``);
    ``replace``: overwrite an existing freeze (needed after the model changed; fresh runs must then be drawn anew).
    """
    root = Path(root)
    if (root / FREEZE_FILE).exists() and not replace:
        raise ParameterError(f"{root / FREEZE_FILE} exists: pass replace=True (--replace) to freeze again")
    every = every or FIT["calibration_every"]
    cost_modes = list(cost_modes or FIT["cost_modes"])
    code = code_hashes(files, repo)
    table, fitted, s1 = _fit(results, every, cost_modes)
    params, slug = s1.params, s1.slug
    s1runs = sources.study1_runs(results).repeat(s1.repeat)
    (root / "frozen").mkdir(parents=True, exist_ok=True)
    models = {}
    for m, cms in sorted(fitted.items()):
        path = cms["gpu+overheads"].save(
            root / "frozen" / f"sim_cost_model_{m.replace(':', '_').replace('/', '_')}.json"
        )
        models[m] = {"file": _rel(path, root), "sha256": ledger.file_sha256(path)}
    err, per_metric, runs = _error(table, "validation")
    cal_err, _, cal_runs = _error(table, "calibration")
    record = {
        "frozen_utc": utc_now(),
        "commit": git_commit(),
        "code": {"files": code, "sha256": combined_sha256(code)},
        "calibration_inputs": _calibration_inputs(results, s1, repo),
        "calibration": {
            "study1": [_rel(r.dir, repo) for r in s1runs.runs],
            "study1_commit": s1.commit,
            "study1_started_utc": s1runs.meta.get("started_utc", ""),
            "seed": params.get("seed"),
            "rate_fractions": params.get("rate_fractions"),
            "calibration_every": every,
            "cost_modes": cost_modes,
            "calibration_runs": cal_runs,
            "calibration_median_abs_error_pct": cal_err,
        },
        "models": models,
        "used_heldout": {"runs": runs, "median_abs_error_pct": err, "per_metric_median_abs_error_pct": per_metric},
    }
    (root / FREEZE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    _record_development(root, record, sources.study1_requests_sha256(results, s1.repeat), slug)
    return record


def _record_development(root: Path, record: dict, sha: str, slug: str) -> None:
    """The ledger's ``development`` row for Study 1's runs (once per data, ``sha`` its request records' hash: a
    re-freeze on them adds nothing)."""
    path = root / LEDGER_FILE
    if len(ledger.used(ledger.read(path), data_sha256=sha)):
        return
    cal = record["calibration"]
    held = record["used_heldout"]
    ledger.append(
        path,
        {
            "run_id": f"study1_{slug}_{cal['study1_commit'][:7] or 'unknown'}",
            "event": "development",
            "utc": record["frozen_utc"],
            "commit": record["commit"],
            "freeze_sha256": ledger.file_sha256(root / FREEZE_FILE),
            "code_sha256": record["code"]["sha256"],
            "data_sha256": sha,
            "seed": cal["seed"],
            "rate_fractions": cal["rate_fractions"] or [],
            "runs": held["runs"],
            "median_abs_error_pct": held["median_abs_error_pct"],
            "note": f"Study 1's runs: {cal['calibration_runs']} fitted the model, {held['runs']} held out from the "
            "fit but reported on while the model was developed",
        },
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.studies.s08_simulator.freeze", description=__doc__)
    ap.add_argument("--replace", action="store_true", help="overwrite an existing freeze (voids its fresh runs)")
    ap.add_argument("--results", type=Path, default=None, help="results root holding Study 1's runs")
    ap.add_argument("--root", type=Path, default=VALIDATION_DIR, help="where the freeze and the ledger live")
    a = ap.parse_args(argv)
    try:
        rec = freeze(root=a.root, results=a.results, replace=a.replace)
    except ParameterError as e:
        ap.exit(2, f"error: {e}\n")
    h = rec["used_heldout"]
    print(
        f"frozen at {rec['commit'][:12]} on {rec['frozen_utc']}: code {rec['code']['sha256'][:12]}, "
        f"{len(rec['models'])} model(s); error on the {h['runs']} used held-out runs "
        f"{h['median_abs_error_pct']:.2f} % (median |error|, six metrics)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
