"""Runs that a study's re-measurement at today's fingerprint has superseded, taken out of the tree (git keeps them).

    python -m servelab.studies.common.prune            # list them
    python -m servelab.studies.common.prune --apply    # git rm them

Why: every GPU call carries the tracked tree within 64 MiB, beside a part of SmolLM2's weights
(``studies.common.carry``), and every study re-measured after a measuring change would otherwise carry its older
runs along for good. No page reads them: a page shows its study's runs at today's fingerprint once there are any.

A fingerprint's folder (``runs/<fp>/``) is superseded once today's fingerprint of its study has every part at
``MIN_REPEATS`` complete repeats (``make gpu-plan`` lists nothing for the study). Never taken: ``runs/legacy/``
(the first H200 runs, which reporting paths read by name) and any folder that a file under ``data/validation``
names (the simulator's freeze hashes the runs it was calibrated on).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from servelab.paths import REPO_ROOT
from servelab.studies.common.campaign import campaign_studies, missing_jobs
from servelab.studies.common.pins import kept_out
from servelab.studies.common.repeats import MIN_REPEATS
from servelab.studies.common.runs import study_runs


def superseded(root: Path | None = None, pins: Path | None = None, studies=None) -> list[Path]:
    """The fingerprint folders (``.../<study>/runs/<fp>``) that today's complete repeats supersede, less the pinned
    ones: ``legacy`` and any folder named in a file under ``pins`` (default: ``data/validation``)."""
    out: list[Path] = []
    for study in studies or campaign_studies():
        runs = study_runs(study, root)
        if not runs.current or missing_jobs(study, MIN_REPEATS, root, runs):
            continue
        out += kept_out({r.dir.parents[1] for r in runs.older}, study, pins)
    return out


def remove(folders: list[Path], repo: Path = REPO_ROOT) -> None:
    """Take ``folders`` out of the index and off the disk (their commits keep them)."""
    for folder in folders:
        subprocess.run(["git", "rm", "-r", "-q", "--ignore-unmatch", str(folder)], cwd=repo, check=True)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.studies.common.prune", description=__doc__.split("\n")[0])
    ap.add_argument("--apply", action="store_true", help="git rm the superseded folders (default: list them)")
    ap.add_argument("--results", type=Path, default=None)
    a = ap.parse_args(argv)
    folders = superseded(a.results)
    for f in folders:
        size = sum(p.stat().st_size for p in f.rglob("*") if p.is_file())
        print(f"{'removed' if a.apply else 'superseded'}: {f} ({size / 1e6:.2f} MB)")
    if not folders:
        print("nothing superseded: no study has all its repeats at today's fingerprint beside older runs")
    if a.apply:
        remove(folders)
    return 0


if __name__ == "__main__":
    sys.exit(main())
