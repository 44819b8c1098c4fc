"""Freeze the simulator's cost model: its code's hashes, its calibration inputs, its fitted coefficients, its error.

``python -m servelab.studies.s08_simulator.freeze`` fits the cost model the page fits (``validation.validation_table``
on Study 1's runs, Study 2's GPU costs where they exist) and writes ``data/validation/sim_freeze.json``:

- ``code``: SHA-256 of every file whose change could move a prediction (``MODEL_FILES``) and one hash over them;
- ``calibration_inputs``: SHA-256 of Study 1's ``requests.csv``/``steps.csv``/``run.json`` and of Study 2's cost
  models and step log that the fit read;
- ``models``: the fitted ``gpu+overheads`` cost model of each model, saved under ``data/validation/frozen/`` (the
  fresh runs are replayed on these files, never on a refit);
- ``used_heldout``: the median |error| (%) on Study 1's validation subset. Those runs were reported on over many
  commits while the model was improved, so the ledger (``ledger.py``) records them as *used during development*.

A fresh run (``heldout.py``) is then drawn after the freeze and evaluated once. Freezing again (``--replace``)
after a change to the model voids every registration made before it: a new fresh run is needed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure.results import git_commit, results_root
from servelab.paths import DATA_DIR, REPO_ROOT
from servelab.sim.cost_model import StepCostModel
from servelab.studies.s08_simulator import ledger, study1_runs, validation

VALIDATION_DIR = DATA_DIR / "validation"
FREEZE_FILE = "sim_freeze.json"
LEDGER_FILE = "ledger.csv"
# how the page calibrates (``report.SETTINGS`` takes these): every other rate fits, Study 2's first mode found
FIT = {"calibration_every": 2, "cost_modes": ["engine", "hf_cuda_graph"]}
# the cost model's own code (the four the issue names), the calibration and the split around it, and the event
# loop that turns step costs into latencies: an edit to any of them can move the error, so it voids the freeze.
# Not covered: the engine's scheduling policies, which the replica drives (a change there changes the server too).
MODEL_FILES = (
    "lib/servelab/sim/cost_model.py",
    "lib/servelab/sim/cost_fit.py",
    "lib/servelab/sim/calibration.py",
    "lib/servelab/studies/s08_simulator/context_reads.py",
    "lib/servelab/studies/s08_simulator/validation.py",
    "lib/servelab/studies/s08_simulator/study1_runs.py",
    "lib/servelab/sim/simulator.py",
    "lib/servelab/sim/replica.py",
)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _rel(path: Path, repo: Path) -> str:
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path(repo).resolve()))
    except ValueError:
        return str(path)


def code_hashes(files=MODEL_FILES, repo: Path = REPO_ROOT) -> dict[str, str]:
    """SHA-256 of each file (paths relative to ``repo``); a missing file is an error, never a silent skip."""
    out = {}
    for f in files:
        p = Path(repo) / f
        if not p.is_file():
            raise ParameterError(f"cost-model file {f!r} does not exist under {repo}")
        out[f] = ledger.file_sha256(p)
    return out


def combined_sha256(hashes: dict[str, str]) -> str:
    """One hash over ``path sha`` lines, sorted by path: equal exactly when every file is."""
    text = "".join(f"{k} {hashes[k]}\n" for k in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()


def load_freeze(root: Path = VALIDATION_DIR) -> dict:
    path = Path(root) / FREEZE_FILE
    if not path.exists():
        raise ParameterError(
            f"no freeze at {path}: freeze the cost model first (python -m servelab.studies.s08_simulator.freeze)"
        )
    return json.loads(path.read_text())


def changed_files(record: dict, repo: Path = REPO_ROOT) -> list[str]:
    """The cost-model files whose hash differs from the freeze's (a deleted file counts as changed)."""
    out = []
    for f, sha in record["code"]["files"].items():
        p = Path(repo) / f
        if not p.is_file() or ledger.file_sha256(p) != sha:
            out.append(f)
    return out


def frozen_models(record: dict, root: Path = VALIDATION_DIR) -> dict[str, StepCostModel]:
    """The frozen cost model of each model, each file checked against the hash the freeze recorded."""
    out = {}
    for model, m in record["models"].items():
        path = Path(root) / m["file"]
        if not path.is_file() or ledger.file_sha256(path) != m["sha256"]:
            raise ParameterError(f"the frozen cost model of {model} ({path}) is missing or was edited after the freeze")
        out[model] = StepCostModel.load(path)
    return out


def _calibration_inputs(s1_dir: Path, repo: Path) -> dict[str, str]:
    files = [s1_dir / n for n in ("requests.csv", "steps.csv", "run.json")]
    # where gpu_cost_model looks first for Study 2's fits: every cost model and the step log found there
    s2 = next(study1_runs.study2_dirs(), None)
    if s2 is not None:
        files += sorted(s2.glob("cost_model_*.json")) + [s2 / "steps.csv"]
    return {_rel(f, repo): ledger.file_sha256(f) for f in files if f.is_file()}


def _error(table: pd.DataFrame, subset: str) -> tuple[float, dict[str, float], int]:
    """Median |error| (%) of the ``gpu+overheads`` model on a subset: over all metrics, per metric, and its runs."""
    t = table[(table["cost_model"] == "gpu+overheads") & (table["subset"] == subset)].dropna(subset=["error_pct"])
    a = t["error_pct"].abs()
    per = a.groupby(t["metric"]).median()
    runs = len(t.drop_duplicates(subset=validation.RUN_KEYS)) if len(t) else 0
    return float(a.median()), {k: float(v) for k, v in per.items()}, runs


def _fit(results: Path | None, every: int, cost_modes: list[str]):
    """Study 1's runs under ``results`` replayed as the page does: ``(table, fitted, params, slug)``."""
    found = study1_runs.load_study1(results)
    if found is None:
        raise ParameterError(f"no Study 1 runs (requests.csv, steps.csv) under {results or results_root()}")
    requests, steps, params, slug = found
    gpu = {}
    for m in sorted(requests["model"].unique()):
        f = study1_runs.gpu_cost_model(m, cost_modes)
        gpu[m] = f[0] if f else None
    deadline = params["window_s"] + params["drain_s"] if {"window_s", "drain_s"} <= set(params) else None
    table, calib, fitted = validation.validation_table(
        requests,
        steps,
        gpu,
        sim_kwargs=study1_runs.sim_kwargs_for(study1_runs.server_limits(params)),
        every=every,
        outputs_for=study1_runs.requested_outputs_for(params),
        deadline_s=deadline,
    )
    bad = calib[calib["status"] != "ok"] if "status" in calib else calib.iloc[0:0]
    if len(bad) or not fitted:
        raise ParameterError(f"the cost model could not be fitted: {bad.to_dict('records') or 'no model'}")
    return table, fitted, params, slug


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
    table, fitted, params, slug = _fit(results, every, cost_modes)
    s1_dir = Path(results or results_root()) / slug / study1_runs.STUDY1
    run = json.loads((s1_dir / "run.json").read_text())
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
        "calibration_inputs": _calibration_inputs(s1_dir, repo),
        "calibration": {
            "study1": _rel(s1_dir, repo),
            "study1_commit": run.get("git_commit", ""),
            "study1_started_utc": run.get("started_utc", ""),
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
    _record_development(root, record, s1_dir / "requests.csv", slug)
    return record


def _record_development(root: Path, record: dict, requests_csv: Path, slug: str) -> None:
    """The ledger's ``development`` row for Study 1's runs (once per data: a re-freeze on them adds nothing)."""
    path = root / LEDGER_FILE
    sha = ledger.file_sha256(requests_csv)
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
