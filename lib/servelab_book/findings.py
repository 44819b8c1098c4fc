"""The studies' verdicts on the seed's claims, read from ``data/results/<device>/<NN_study>/findings.csv``.

Only runs on the book's device (a device slug containing ``h200``) count: a CPU smoke run must never
show up in the book as an H200 value. When several slugs match, the most recent run wins.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servelab.measure.results import FINDINGS_COLUMNS, FINDINGS_OPTIONAL, VERDICTS, results_root
from servelab_book.seed_claims import claim_sort_key
from servelab_book.studies import STUDIES

BOOK_DEVICE = "h200"
# Claims whose verdict comes from a later, better-placed run than their own study's: F2.3 asks whether costs
# measured in isolation predict a server under load, which only the simulator's validation against the real
# server (issue #7) can answer. (claim id -> results folder, file); the study's own row stays in its note.
EVIDENCE = {"F2.3": ("08_simulator", "f23_evidence.csv")}
RUN_COLUMNS = [
    "study",
    "device_slug",
    "device_name",
    "started_utc",
    "git_commit",
    "torch",
    "cuda",
    "driver",
    "copy_gb_s",
    "matmul_tflop_s",
    "matmul_dtype",
    "cpu_model",
    "cpu_cores",
    "sm_clock_start_mhz",
    "sm_clock_end_mhz",
]


SHOWN_COLUMNS = FINDINGS_COLUMNS + list(FINDINGS_OPTIONAL)


class FindingsError(ValueError):
    """A findings.csv file that the book cannot show; the message names the file and the fix."""


def read_run(run_json: Path) -> dict:
    """One row of provenance from a study's ``run.json`` sidecar (missing fields become None)."""
    side = json.loads(run_json.read_text())
    dev, ceil = side.get("device") or {}, side.get("ceilings") or {}
    return {
        "study": side.get("study", run_json.parent.name),
        "device_slug": run_json.parent.parent.name,
        "device_name": dev.get("name"),
        "started_utc": side.get("started_utc"),
        "git_commit": side.get("git_commit"),
        "torch": dev.get("torch"),
        "cuda": dev.get("cuda"),
        "driver": dev.get("driver"),
        "copy_gb_s": ceil.get("copy_gb_s"),
        "matmul_tflop_s": ceil.get("matmul_tflop_s"),
        "matmul_dtype": ceil.get("matmul_dtype"),
        # the host and the SM clocks: None where a record predates them (the page says "not recorded")
        "cpu_model": dev.get("cpu_model"),
        "cpu_cores": dev.get("cpu_cores"),
        "sm_clock_start_mhz": (dev.get("clocks_start") or {}).get("clocks.sm"),
        "sm_clock_end_mhz": (dev.get("clocks_end") or {}).get("clocks.sm"),
    }


def book_runs(root: Path | None = None, device: str = BOOK_DEVICE) -> pd.DataFrame:
    """The run of each study on the book's device (latest if several device slugs match), one row each."""
    root = Path(root or results_root())
    rows = [read_run(p) for s in STUDIES for p in sorted(root.glob(f"*{device}*/{s.slug}/run.json"))]
    runs = pd.DataFrame(rows, columns=RUN_COLUMNS)
    if runs.empty:
        return runs
    runs = runs.sort_values(["study", "started_utc"], na_position="first").groupby("study").tail(1)
    return runs.sort_values("study").reset_index(drop=True)


def read_findings(path: Path, study: str) -> pd.DataFrame:
    """Read one ``findings.csv`` and check it: columns, verdicts, and ids that belong to ``study``."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in FINDINGS_COLUMNS if c not in df.columns]
    if missing:
        raise FindingsError(f"{path}: missing columns {missing}")
    bad = sorted(set(df["verdict"]) - set(VERDICTS))
    if bad:
        raise FindingsError(f"{path}: verdict must be one of {VERDICTS}, got {bad}")
    number = int(study[:2])
    for claim_id in df["id"]:
        try:
            owner = claim_sort_key(claim_id)[0]
        except ValueError as e:
            raise FindingsError(f"{path}: {e}") from None
        if owner != number:
            raise FindingsError(f"{path}: claim {claim_id} belongs to study {owner}, not to {study}")
    if df["id"].duplicated().any():
        raise FindingsError(f"{path}: duplicate ids {df.loc[df['id'].duplicated(), 'id'].tolist()}")
    for col, default in FINDINGS_OPTIONAL.items():  # older files lack them: one run, nothing more recorded
        if col not in df.columns:
            df[col] = str(default)
    return df[SHOWN_COLUMNS]


def book_findings(root: Path | None = None, device: str = BOOK_DEVICE) -> pd.DataFrame:
    """Every claim verdict measured on the book's device, with the run it came from.

    Columns: the findings columns, then ``study``, ``device_slug``, ``device_name``, ``started_utc``,
    ``git_commit``. Claims no run has measured are simply absent.
    """
    root = Path(root or results_root())
    runs = book_runs(root, device)
    frames = []
    for run in runs.itertuples():
        path = root / run.device_slug / run.study / "findings.csv"
        if path.exists():
            df = read_findings(path, run.study)
            frames.append(
                df.assign(
                    study=run.study,
                    device_slug=run.device_slug,
                    device_name=run.device_name,
                    started_utc=run.started_utc,
                    git_commit=run.git_commit,
                )
            )
    cols = SHOWN_COLUMNS + ["study", "device_slug", "device_name", "started_utc", "git_commit"]
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)[cols]
    out = _apply_evidence(out, root, device)
    return out.iloc[sorted(range(len(out)), key=lambda i: claim_sort_key(out["id"].iloc[i]))].reset_index(drop=True)


def _apply_evidence(out: pd.DataFrame, root: Path, device: str) -> pd.DataFrame:
    """Replace a claim's row by its ``EVIDENCE`` run's row where that run exists on the book's device; the
    study's own verdict is kept in the note, and the provenance columns name the evidence run."""
    out = out.copy()
    for claim_id, (folder, name) in EVIDENCE.items():
        found = sorted(root.glob(f"*{device}*/{folder}/{name}"))
        mine = out.index[out["id"] == claim_id]
        if not found or mine.empty:
            continue
        ev = pd.read_csv(found[-1], dtype=str, keep_default_na=False)
        missing = [c for c in FINDINGS_COLUMNS if c not in ev.columns]
        if missing or list(ev["id"]) != [claim_id] or ev["verdict"].iat[0] not in VERDICTS:
            raise FindingsError(
                f"{found[-1]}: needs the findings columns, one row for {claim_id} and a verdict in {VERDICTS}"
            )
        run = read_run(found[-1].parent / "run.json")
        i, row = mine[0], ev.iloc[0]
        own = out.loc[i]
        note = (
            f"{row['note']} (from {folder}'s validation run; the study's own run alone said: {own['verdict']}, "
            f"{own['measured_value']} {own['unit']})"
        )
        out.loc[i, FINDINGS_COLUMNS] = [
            row["id"],
            own["claim"],
            own["seed_value"],
            row["measured_value"],
            row["unit"],
            row["verdict"],
            note,
        ]
        for col, default in FINDINGS_OPTIONAL.items():  # the evidence run's repeats, not the study's
            out.loc[i, col] = row[col] if col in ev.columns else str(default)
        out.loc[i, ["device_slug", "device_name", "started_utc", "git_commit"]] = [
            run["device_slug"],
            run["device_name"],
            run["started_utc"],
            run["git_commit"],
        ]
    return out
