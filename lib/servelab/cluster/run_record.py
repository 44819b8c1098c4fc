"""What a run of the "Beyond one GPU" page records, and where (``capacity_run``, ``tp_run``): the machine (the
device record with how many GPUs the run could spread over), its folder, and its ``run.json``.

A run's folder is ``<results>/<device>-x<GPUs>/09_beyond_one_gpu/runs/<fingerprint[:12]>/<part>/r<repeat>/``: the
machine's slug names the GPU count, so that a run on two H200s never lands beside the one-H200 runs of the studies.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from servelab.measure.results import git_commit, results_root

STUDY = "09_beyond_one_gpu"


def machine_record() -> dict:
    from servelab.cluster.serve import gpus
    from servelab.measure.device import device_record

    rec = device_record()
    n = len(gpus(rec.kind))
    return {**rec.as_dict(), "gpus": n, "folder": f"{rec.slug}-x{n}" if n > 1 else rec.slug}


def run_folder(machine: dict, fingerprint: str, part: str, repeat: int) -> Path:
    return results_root() / machine["folder"] / STUDY / "runs" / fingerprint[:12] / part / f"r{repeat}"


def write_run(out: Path, *, part: str, repeat: int, seed: int, fingerprint: str, machine: dict, started: float,
              params: dict) -> None:  # fmt: skip
    """``run.json``, written last: a run folder without it (a job cut off) is read by no page."""
    if machine.get("kind") == "cuda":
        from servelab.measure.device import read_clocks

        machine = {**machine, "clocks_end": read_clocks()}
    meta = {
        "study": STUDY, "part": part, "repeat_index": repeat, "seed": seed, "fingerprint": fingerprint,
        "git_commit": git_commit(), "device": machine, "duration_s": time.time() - started, "params": params,
        "complete": True,
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(meta, indent=1, default=str))
