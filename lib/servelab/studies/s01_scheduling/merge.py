"""Study 1's parts, run one GPU run each, joined into one result when one commit produced them all.

``merge_parts(folders, dest)`` reads each part's ``run.json``: their ``git_commit`` must be one commit, their
parameters the same apart from ``parts``, their devices one kind; no (model, policy setting, rate, sweep) point may
come from two parts. It writes the union of the tables to ``dest``, recomputes what depends on all of them (the
capacity table and the findings) from the merged summary, and writes a ``run.json`` that names the commit and every
part (its folder, start and end). A part's probe rows stay, one per model and part, with a ``part`` column.

    python -m servelab.studies.s01_scheduling.merge DEST PART_FOLDER...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure.results import findings_frame
from servelab.studies.s01_scheduling import verdicts
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.run import STUDY, TABLES

POINT = ["model", "scheduler", "budget", "rate_fraction", "sweep"]
# parameters allowed to differ between parts: what each part selects and its own wall-time budget
PER_PART = ("parts", "time_budget_s")


def _sidecars(folders: list[Path]) -> list[dict]:
    if not folders:
        raise ParameterError("merge_parts needs at least one part folder")
    out = []
    for f in folders:
        path = Path(f) / "run.json"
        if not path.is_file():
            raise ParameterError(f"{f}: no run.json, not a Study 1 result folder")
        out.append(json.loads(path.read_text()))
    return out


def check_parts(sidecars: list[dict], folders: list[Path]) -> None:
    """``ParameterError`` unless the parts come from one commit, one device kind and one set of parameters."""
    commits = {s.get("git_commit") for s in sidecars}
    if len(commits) != 1 or None in commits or "unknown" in commits:
        named = ", ".join(f"{f}: {s.get('git_commit')}" for f, s in zip(folders, sidecars, strict=True))
        raise ParameterError(f"parts come from different (or unknown) commits, not one run: {named}")
    devices = {s.get("device", {}).get("slug") for s in sidecars}
    if len(devices) != 1:
        raise ParameterError(f"parts ran on different devices: {sorted(map(str, devices))}")
    shared = [{k: v for k, v in s["params"].items() if k not in PER_PART} for s in sidecars]
    for f, p in zip(folders[1:], shared[1:], strict=True):
        diff = sorted(k for k in set(p) | set(shared[0]) if p.get(k) != shared[0].get(k))
        if diff:
            raise ParameterError(f"{f}: parameters differ from {folders[0]}'s in {diff}")


def _table(folders: list[Path], name: str) -> pd.DataFrame:
    frames = []
    for f in folders:
        path = Path(f) / f"{name}.csv"
        if path.is_file() and path.stat().st_size:
            frames.append(pd.read_csv(path).assign(part=Path(f).name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _one_part_per_point(summary: pd.DataFrame) -> None:
    measured = summary[summary["status"] == "ok"]
    twice = measured[measured.duplicated(POINT, keep=False)]
    if len(twice):
        raise ParameterError(f"points measured by more than one part: {twice[POINT + ['part']].to_dict('records')}")


def merge_parts(folders, dest) -> Path:
    """Join the parts in ``folders`` into ``dest`` (tables, capacity, findings, run.json); the ``dest`` path."""
    folders, dest = [Path(f) for f in folders], Path(dest)
    sidecars = _sidecars(folders)
    check_parts(sidecars, folders)
    tables = {name: _table(folders, name) for name in TABLES}
    summary = tables["summary"]
    if summary.empty:
        raise ParameterError(f"no summary rows in {[str(f) for f in folders]}")
    _one_part_per_point(summary)
    # a point one part skipped (time budget) and another measured: the measurement stands
    ok = set(map(tuple, summary.loc[summary["status"] == "ok", POINT].to_numpy().tolist()))
    keep = [r["status"] == "ok" or tuple(r[POINT]) not in ok for _, r in summary.iterrows()]
    tables["summary"] = summary = summary[keep].reset_index(drop=True)
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for name, df in tables.items():
        if not df.empty:
            df.to_csv(dest / f"{name}.csv", index=False)
            files.append(f"{name}.csv")
    P = {**sidecars[0]["params"], "parts": None}
    capacity_table(summary).to_csv(dest / "capacity.csv", index=False)
    rows = [f.row() for f in verdicts.findings(summary, P["reference_budget"], P["dtype"])]
    findings_frame(rows).to_csv(dest / "findings.csv", index=False)
    side = {
        **{k: v for k, v in sidecars[0].items() if k not in ("started_utc", "written_utc", "files", "params")},
        "study": STUDY,
        "params": P,
        "started_utc": min(s["started_utc"] for s in sidecars),
        "written_utc": max(s["written_utc"] for s in sidecars),
        "files": [*files, "capacity.csv", "findings.csv"],
        "parts": [
            {
                "folder": str(f),
                "parts": s["params"].get("parts"),
                "started_utc": s["started_utc"],
                "written_utc": s["written_utc"],
            }
            for f, s in zip(folders, sidecars, strict=True)
        ],
    }
    (dest / "run.json").write_text(json.dumps(side, indent=2) + "\n")
    return dest


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(merge_parts(sys.argv[2:], sys.argv[1]))
