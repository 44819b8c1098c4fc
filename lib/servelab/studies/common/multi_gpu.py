"""The GPU jobs of the "Beyond one GPU" page (issue 31), which need a machine of several GPUs: `make gpu-plan`
lists them as held back until it is told the machine has enough (``--gpus N``, where ``status`` lends such a kind).

- ``09_beyond_one_gpu:tp<N>:R``: the tensor parallel timings on the 8B shape, one size a part, TP = 1, 2, 4
  (``servelab.cluster.tp_run``);
- ``09_beyond_one_gpu:n1:R``, ``...:n2-<router>:R``, ``...:n4-<router>:R``: the real replicas' capacity, one part per
  (N, router), with the simulator's prediction's settings (``studies.s08_simulator.cluster_run``).

A job is missing while the results root holds no complete run of it, on a machine of the book's device, at its
measuring module's fingerprint today (its folder: ``<device>-x<GPUs>/09_beyond_one_gpu/runs/<fp[:12]>/<part>/r<R>/``).
The book's device, because the prediction the replicas are set beside is calibrated on it: a run on H100s is shown on
the page under its own device, and leaves the job listed.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.cluster import run_record
from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import BOOK_DEVICE
from servelab.studies.s08_simulator import cluster_run

STUDY = run_record.STUDY


@dataclass(frozen=True)
class MultiGpuJob:
    part: str
    gpus: int  # GPUs the job needs
    module: str  # the measuring module whose fingerprint names the run's folder
    guess_min: float
    server: bool  # it starts the OpenAI server (whose wheels the GPU machine lacks unless carried)

    def command(self, repeat: int) -> list[str]:
        if self.part in TP_SIZES:
            size = str(TP_SIZES[self.part])
            return [sys.executable, "-m", self.module, "--sizes", size, "--part", self.part, "--repeat", str(repeat)]
        return [sys.executable, "-m", cluster_run.__name__, self.part, "--repeat", str(repeat)]


# the tensor parallel timings one size a part: an 8B engine's load, compile and graph capture take a minute or two
# per size, three in one run could pass a GPU run's 9 minutes. Every part needs the machine of the largest split,
# since the page compares the sizes of one repeat on one machine
TP_SIZES = {"tp1": 1, "tp2": 2, "tp4": 4}
JOBS = {
    **{
        part: MultiGpuJob(part, max(TP_SIZES.values()), "servelab.cluster.tp_run", 3.0, server=False)
        for part in TP_SIZES
    },  # fmt: skip
    **{
        part: MultiGpuJob(
            part, cluster_run.gpus_needed(part), "servelab.cluster.capacity_run", cluster_run.GUESS_MIN, server=True
        )  # fmt: skip
        for part in cluster_run.PARTS
    },
}


def done(root: Path) -> set[tuple[str, int]]:
    """(part, repeat) of every complete run at its module's fingerprint today, on a machine of the book's device."""
    out = set()
    # two measuring modules among the jobs: each closure is hashed once, not once a job
    today = {m: fingerprint(m).digest[:12] for m in {job.module for job in JOBS.values()}}
    for job in JOBS.values():
        fp = today[job.module]
        for meta in Path(root).glob(f"*{BOOK_DEVICE}*/{STUDY}/runs/{fp}/{job.part}/r*/run.json"):
            try:
                complete = json.loads(meta.read_text()).get("complete")
            except (OSError, ValueError):
                continue
            if complete and meta.parent.name[1:].isdigit():
                out.add((job.part, int(meta.parent.name[1:])))
    return out


def recorded_min(root: Path, part: str) -> float | None:
    """The median recorded minutes of ``part``'s complete runs at any fingerprint (None: never run)."""
    times = []
    for meta in Path(root).glob(f"*{BOOK_DEVICE}*/{STUDY}/runs/*/{part}/r*/run.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if m.get("complete") and m.get("duration_s"):
            times.append(float(m["duration_s"]) / 60)
    return statistics.median(times) if times else None


def missing(root: Path, repeats: int) -> list[tuple[MultiGpuJob, int, float, str]]:
    """Every (job, repeat, expected minutes, basis) with no complete run today, tensor parallelism first, then the
    replicas by N."""
    have = done(root)
    out = []
    for job in JOBS.values():
        rec = recorded_min(root, job.part)
        minutes, basis = (rec, "recorded") if rec else (job.guess_min, "guess")
        out += [(job, r, minutes, basis) for r in range(repeats) if (job.part, r) not in have]
    return out
