"""The simulator's frozen cost model as recorded: where the record lives, which code it covers, and reading it back.

``freeze.py`` makes the record (it fits the model from the runs, as the page does); this module only reads it, so
that the measuring path (``measure.freeze_check``: is today's cost-model code the frozen one?) reads no run and
fits nothing. ``data/validation/sim_freeze.json`` holds:

- ``code``: SHA-256 of every file whose change could move a prediction (``MODEL_FILES``) and one hash over them;
- ``calibration_inputs``: SHA-256 of every file the fit read (Study 1's request records, step logs and
  ``run.json``s, Study 2's step logs);
- ``models``: the fitted ``gpu+overheads`` cost model of each model, saved under ``data/validation/frozen/`` (the
  fresh runs are replayed on these files, never on a refit);
- ``used_heldout``: the median |error| (%) on Study 1's validation subset. Those runs were reported on over many
  commits while the model was improved, so the ledger (``ledger.py``) records them as *used during development*.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path

from servelab.errors import ParameterError
from servelab.paths import DATA_DIR, REPO_ROOT
from servelab.sim.cost_model import StepCostModel
from servelab.studies.s08_simulator import ledger

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
    "lib/servelab/studies/s08_simulator/sources.py",
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
