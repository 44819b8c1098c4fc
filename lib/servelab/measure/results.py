"""Result records: tidy CSVs under ``data/results/<device-slug>/<NN_study>/`` with a JSON sidecar.

The sidecar ``run.json`` holds the git commit, UTC time, device record, measured ceilings and the
notebook's parameters. ``findings.csv`` holds one row per seed claim with a verdict. Everything the
book shows is computed from these files.

The results root is ``data/results`` in the repository, or ``$SERVELAB_RESULTS`` when set (CI's smoke
runs write to a scratch directory so they never touch the committed H200 data).

Repeats are runs of their own: a measuring path's run (``measuring=``) goes to
``<NN_study>/runs/<fingerprint>/<part>/r<repeat>/`` (``studies.common.campaign`` plans and runs them).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd

from servelab.paths import REPO_ROOT

RUNS = "runs"  # a study's measured runs, by fingerprint, part and repeat (``run_folder``)
DIGITS = 12  # of a fingerprint, in folder names

# "inconclusive": the repeats of a claim disagree (the spread is shown beside it)
VERDICTS = ("holds", "changes", "fails", "inconclusive")
FINDINGS_COLUMNS = ["id", "claim", "seed_value", "measured_value", "unit", "verdict", "note"]
# columns a findings row may omit, with what an omitted one means (one run, models named in the note)
# and the interval of the measured value over the repeats ("low–high", see studies.common.repeats)
# headline: the one number the verdict is decided on (empty where none was measured), in headline_unit
FINDINGS_OPTIONAL = {
    "tested_on": "",
    "repeats": 1,
    "repeat_verdicts": "",
    "spread": "",
    "headline": "",
    "headline_unit": "",
}


def results_root() -> Path:
    return Path(os.environ.get("SERVELAB_RESULTS", REPO_ROOT / "data" / "results"))


def git_commit() -> str:
    """The commit the code ran at: ``$SERVELAB_REVISION`` when a run script sets it (the GPU machine's copy
    of the tree may carry a stale ``.git`` of its own, whose HEAD is not what runs), else git's HEAD
    (``+dirty`` with uncommitted changes), else ``.revision``."""
    env = os.environ.get("SERVELAB_REVISION", "").strip()
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    rev = REPO_ROOT / ".revision"
    return rev.read_text().strip() if rev.exists() else "unknown"


def _jsonable(o):
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def run_folder(study_dir: Path, fingerprint: str, part: str, repeat: int) -> Path:
    """Where one measured run lives: ``<study>/runs/<fingerprint>/<part>/r<repeat>/`` (see ``measuring=``)."""
    return Path(study_dir) / RUNS / fingerprint[:DIGITS] / part / f"r{repeat}"


def next_repeat(parent: Path) -> int:
    """The lowest repeat index with no finished run under ``parent`` (a part's folder)."""
    taken = {int(d.name[1:]) for d in Path(parent).glob("r*") if d.name[1:].isdigit()}
    return next(i for i in range(len(taken) + 1) if i not in taken)


class StudyResults:
    """Writes one study's results for one device.

    ``measuring``: the dotted name of the measuring module that runs (a study's ``measure``, passing ``__name__``).
    The run then goes to its own folder, ``<study>/runs/<fingerprint>/<part>/r<repeat>/``, where ``part`` and
    ``repeat`` come from ``params`` (``"all"`` and the next free index when absent), and ``run.json`` records the
    measuring path's fingerprint with the hash of every file in it: the reporting path reads every repeat of one
    fingerprint, and a page whose data's fingerprint is not today's names the files that changed. Without it the
    results go to the study's folder itself (the engine bench's layout).
    """

    def __init__(
        self, study: str, device, params: dict, ceilings=None, root: Path | None = None, *, measuring: str | None = None
    ):
        self.study = study
        self.device = device
        self.params = dict(params)
        self.ceilings = ceilings
        self.device_dir = Path(root or results_root()) / device.slug
        self.fingerprint = None
        if measuring is not None:
            from servelab.measure.fingerprint import fingerprint

            self.fingerprint = fingerprint(measuring)
            part = str(self.params.get("part") or "all")
            parent = self.device_dir / study / RUNS / self.fingerprint.short / part
            rep = self.params.get("repeat")
            rep = next_repeat(parent) if rep is None else int(rep)
            self.params.update(part=part, repeat=rep)
            self.dir = run_folder(self.device_dir / study, self.fingerprint.digest, part, rep)
            if self.dir.is_dir():
                shutil.rmtree(self.dir)  # the same repeat measured again: none of the old files belong to it
        else:
            self.dir = self._folder(study)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: list[str] = []
        self._t0 = time.monotonic()
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.write_sidecar()

    def _folder(self, study: str) -> Path:
        """``study``'s folder on this device (the flat layout of a run without ``measuring=``)."""
        return self.device_dir / study

    def write_sidecar(self, **extra) -> Path:
        path = self.dir / "run.json"
        fp = self.fingerprint
        side = {
            "study": self.study,
            "git_commit": git_commit(),
            "started_utc": self.started,
            "written_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - self._t0, 1),
            "device": self.device,
            "ceilings": self.ceilings,
            "params": self.params,
            "files": self.files,
            **(
                {
                    "part": self.params["part"],
                    "repeat_index": self.params["repeat"],
                    "seed": self.params.get("seed"),
                    "fingerprint": fp.digest,
                    "measuring_module": fp.module,
                    "fingerprint_files": fp.files,
                }
                if fp is not None
                else {}
            ),
            **extra,
        }
        path.write_text(json.dumps(side, indent=2, default=_jsonable) + "\n")
        return path

    def write(self, name: str, df: pd.DataFrame) -> Path:
        """Write a tidy table as ``<name>.csv`` and list it in the sidecar."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"result name must be alphanumeric with underscores, got {name!r}")
        path = self.dir / f"{name}.csv"
        df.to_csv(path, index=False)
        if path.name not in self.files:
            self.files.append(path.name)
        self.write_sidecar()
        return path

    def write_for(self, study: str, name: str, df: pd.DataFrame) -> Path:
        """Write ``<name>.csv`` into another study's folder of the same device: a result that belongs to that
        study's question but is computed here (the simulator's validation of Study 1's runs). This sidecar
        lists it as ``<study>/<name>.csv``; the file's own provenance is this run's sidecar."""
        if not name.replace("_", "").isalnum() or not study.replace("_", "").isalnum():
            raise ValueError(f"study and result names must be alphanumeric with underscores, got {study!r}, {name!r}")
        folder = self._folder(study)
        if not folder.is_dir():
            raise FileNotFoundError(f"no results of study {study!r} under {self.device_dir}: nothing to add to")
        path = folder / f"{name}.csv"
        df.to_csv(path, index=False)
        entry = f"{study}/{path.name}"
        if entry not in self.files:
            self.files.append(entry)
        self.write_sidecar()
        return path

    def write_json(self, name: str, obj) -> Path:
        """Write a JSON artefact (e.g. a fitted cost model) beside the CSVs and list it in the sidecar."""
        if not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"artefact name must be alphanumeric with _ - ., got {name!r}")
        path = self.dir / f"{name}.json"
        path.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
        if path.name not in self.files:
            self.files.append(path.name)
        self.write_sidecar()
        return path

    def write_findings(self, rows: list[dict]) -> Path:
        return self.write("findings", findings_frame(rows))

    def finish(self, **extra) -> Path:
        """Stamp the end-of-run clocks into the device record and rewrite the sidecar, marked ``complete``: the
        reporting path reads only complete runs (a run cut off by its time limit leaves an incomplete folder)."""
        if hasattr(self.device, "close"):
            self.device.close()
        return self.write_sidecar(complete=True, **extra)


def findings_frame(rows: list[dict]) -> pd.DataFrame:
    """Validate findings rows: every column present, a known verdict, one row per claim; optional columns filled."""
    df = pd.DataFrame(rows)
    missing = [c for c in FINDINGS_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"findings rows lack columns {missing}")
    bad = df.loc[~df["verdict"].isin(VERDICTS), "verdict"].tolist()
    if bad:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {bad}")
    if df["id"].duplicated().any():
        raise ValueError(f"duplicate finding ids: {df.loc[df['id'].duplicated(), 'id'].tolist()}")
    for col, default in FINDINGS_OPTIONAL.items():
        df[col] = df[col].fillna(default) if col in df.columns else default
    return df[FINDINGS_COLUMNS + list(FINDINGS_OPTIONAL)]


def load_results(study: str, name: str, slug: str | None = None, root: Path | None = None) -> pd.DataFrame:
    """Read ``<name>.csv`` of ``study``; with no slug, the one device that has it (the H200 if several)."""
    root = Path(root or results_root())
    if slug is None:
        found = sorted(p.parent.parent.name for p in root.glob(f"*/{study}/{name}.csv"))
        if not found:
            raise FileNotFoundError(f"no {study}/{name}.csv under {root}")
        slug = next((s for s in found if "h200" in s), found[0])
    return pd.read_csv(root / slug / study / f"{name}.csv")
