"""The held-out ledger: an append-only CSV of every run the simulator's error was reported on, and when.

One row per event, never edited (``data/validation/ledger.csv``, committed, so that a run's single use survives
the session that used it):

- ``development``: runs the model was developed against (Study 1's runs at the freeze): their error was looked
  at over many commits, so they are *used*, never fresh;
- ``registered``: a fresh run's spec (``data/validation/<run_id>.yaml``), written after the freeze and before
  any of its data existed;
- ``reported``: the one evaluation of a fresh run (``heldout.report_once``), after which it is used too.

``freeze_sha256`` is the SHA-256 of the ``sim_freeze.json`` an event was made under (a registration counts only
under its own freeze); ``data_sha256`` that of the run's ``requests.csv``, so that the same data is refused under
a new name.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError

COLUMNS = [
    "run_id",
    "event",
    "utc",
    "commit",
    "freeze_sha256",
    "code_sha256",
    "data_sha256",
    "seed",
    "rate_fractions",
    "runs",
    "median_abs_error_pct",
    "note",
]
EVENTS = ("development", "registered", "reported")
USED = ("development", "reported")  # events after which a run is never fresh again


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read(path: Path) -> pd.DataFrame:
    """The ledger's rows (an empty frame with its columns where there is no ledger yet)."""
    path = Path(path)
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ParameterError(f"{path}: not a held-out ledger (missing columns {missing})")
    return df[COLUMNS]


def append(path: Path, row: dict) -> None:
    """Add one event; unknown keys and events are refused (the ledger's form never drifts)."""
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown or row.get("event") not in EVENTS or not row.get("run_id"):
        raise ParameterError(f"a ledger row needs a run_id and an event in {EVENTS}, and only {COLUMNS}; got {row!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        if new:
            w.writeheader()
        w.writerow({c: _cell(row.get(c, "")) for c in COLUMNS})


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ";".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    return str(v)


def used(ledger: pd.DataFrame, run_id: str | None = None, data_sha256: str | None = None) -> pd.DataFrame:
    """The rows that used a run: by its id, or by the hash of its data (a copy under another name)."""
    u = ledger[ledger["event"].isin(USED)]
    hit = pd.Series(False, index=u.index)
    if run_id is not None:
        hit |= u["run_id"] == run_id
    if data_sha256:
        hit |= u["data_sha256"] == data_sha256
    return u[hit]


def status(ledger: pd.DataFrame, freeze_sha256: str | None = None) -> pd.DataFrame:
    """One row per run: its latest event and what it says (``used during development``, ``fresh: registered``,
    ``used: reported once``), with the error where one was reported. ``freeze_sha256``: the current freeze's hash;
    a registration under another freeze reads ``void`` (freezing again voids it). The seeds of a run registered
    for several repeats read as their range."""
    rows = []
    for run_id, g in ledger.groupby("run_id", sort=False):
        last = g.iloc[-1]
        reported = g[g["event"].isin(USED)]
        if len(reported):
            last = reported.iloc[-1]
        state = {
            "development": "used during development",
            "registered": "fresh (registered, not yet evaluated)",
            "reported": "used (evaluated once)",
        }[last["event"]]
        seed = last["seed"]
        if last["event"] == "registered":
            reg = g[(g["event"] == "registered") & (g["freeze_sha256"] == last["freeze_sha256"])]
            seeds = sorted({int(x) for x in reg["seed"] if str(x).strip().lstrip("-").isdigit()})
            if len(seeds) > 1:
                seed = f"{seeds[0]}–{seeds[-1]}"
            if freeze_sha256 is not None and last["freeze_sha256"] != freeze_sha256:
                state = "void (registered under an earlier freeze; never run)"
        rows.append(
            {
                "run_id": run_id,
                "status": state,
                "since_utc": last["utc"],
                "seed": seed,
                "rate_fractions": last["rate_fractions"],
                "runs": last["runs"],
                "median_abs_error_pct": last["median_abs_error_pct"],
                "note": last["note"],
            }
        )
    return pd.DataFrame(rows)
