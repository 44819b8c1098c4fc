"""The GPU work still missing at today's fingerprints, packed into GPU runs, and the runner of those jobs.

    python -m servelab.studies.common.campaign plan [--repeats 3] [--max-minutes 9] [--results DIR]
    python -m servelab.studies.common.campaign run JOB [JOB ...]       # on the GPU machine (scripts/gpu_run.sh)
    python -m servelab.studies.common.campaign job STUDY PART REPEAT    # one job, in this process

A **job** is one part of one repeat of one study, ``STUDY:PART:REPEAT`` (``02_gpu_costs:all:0``), one of the engine
page's two runs, ``engine:bench:0`` and ``engine:step_budget:0`` (``servelab.bench.jobs``), or the warm-up
``drafts:smollm2:0`` (``warm_drafts``), which a session runs before the jobs that read SmolLM2's distilled drafts
(``DRAFT_PARTS``) and which writes no data. The plan lists
every (study, part, repeat) with no complete run at the study's fingerprint today (``measure.fingerprint``), gives
each its expected minutes (the median recorded ``duration_s`` of that part's earlier runs, any fingerprint, plus
``START_MIN`` for a fresh process; else the part's guess in ``measure.PARTS``) and packs them, largest first, into
GPU runs of at most ``--max-minutes``. Runs from different GPU runs merge by themselves: each job writes its own
folder, ``runs/<fingerprint>/<part>/r<repeat>/``.

Repeat ``r`` runs with the study's default seed + ``r``: fresh processes, new seeds, new traces. The engine's jobs run
once at each fingerprint of their own measuring path, after the studies.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.bench import jobs as engine_jobs
from servelab.errors import ParameterError
from servelab.measure.results import results_root
from servelab.studies.common import carry, multi_gpu, rerun_check, warm_drafts
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
SMOLLM2_PARTS = {
    "03_speculative": ("real", "lookup"),
    "06_hf_assisted": ("p0", "p1", "p2"),
    "engine": ("bench",),  # its exactness row on trained weights (bench.plan); without them the row is left out
    "drafts": ("smollm2",),  # the warm-up distils from SmolLM2
}
# the parts that load SmolLM2's distilled drafts from the machine's cache, which the warm-up job fills once a session
# (warm_drafts). Study 3's ``real`` distils its own, with the repeat's seed in the recipe, so no warm-up serves it
DRAFT_PARTS = {"06_hf_assisted": ("p0", "p1", "p2")}
WARM_STUDY, WARM_PART = "drafts", "smollm2"
CACHED_DRAFTS_S = 15.0  # loading the cached drafts, which a draft part's recorded time keeps in place of distilling
MAX_MINUTES = 9.0  # a GPU run: the device allows 10 minutes a command; one is kept for start-up and packing
# a session's device time (30 min), less the machine's start and each call's transfer; and a staging call's
SESSION_MINUTES = 28.0
STAGE_CALL_MIN = 0.5
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

    @property
    def drafts(self) -> bool:
        """It loads the distilled drafts that a warm-up job left in the machine's cache."""
        return self.part in DRAFT_PARTS.get(self.study, ())

    @property
    def warm_up(self) -> bool:
        return (self.study, self.part) == (WARM_STUDY, WARM_PART)


WARM_JOB = Job(WARM_STUDY, WARM_PART, 0, warm_drafts.GUESS_MIN, "bounded by the distillation recipe")


# the studies a re-run check may re-measure: each judged on its own runs. The simulator's page reads Study 1's runs,
# so a re-run of it would re-measure only its fresh held-out run
RERUN_STUDIES = tuple(s for s in ORDER if s != "08_simulator")
# the studies whose measuring path starts the OpenAI server (uvicorn + FastAPI), which the GPU machine's image lacks:
# they travel as wheels (.whl/); without them every server fails to start and the run holds only errors
SERVER_STUDIES = ("01_scheduling", "07_prefix_cache", "08_simulator")
# imported, not only found: fastapi 0.165's app imports opentelemetry-api, and on 2026-12-04 a fastapi carried without
# it was found, failed at the server's start, and Study 1's run recorded an error row per point
SERVER_MODULES = ("uvicorn", "fastapi.applications")


def missing_here(study: str, part: str) -> str:
    """What this machine lacks for the job to measure anything ("" when nothing): checked before a job starts, so
    that a job which could only record failures (a server that cannot start, weights that are not there) is not run
    and leaves no run that looks complete."""
    if study in SERVER_STUDIES or (study == multi_gpu.STUDY and multi_gpu.JOBS[part].server):
        absent = [f"{m} ({e})" for m in SERVER_MODULES if (e := _import_error(m))]
        if absent:
            return f"{', '.join(absent)} cannot be imported (carry .whl/, made by scripts/gpu_wheels.sh)"
    if part in SMOLLM2_PARTS.get(study, ()):
        from servelab.models.loader import smollm2_gguf

        try:
            smollm2_gguf()
        except Exception as e:  # ModelLoadError: the package or its GGUF is missing
            return f"SmolLM2's GGUF not installed ({e}); stage .models/smollm2's parts (scripts/gpu_run.sh)"
    return ""


def _import_error(module: str) -> str:
    """Why ``module`` cannot be imported here ("" when it can)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or whatever a half-installed package raises while it imports
        return f"{type(e).__name__}: {e}"
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


def estimates(study: str, root: Path | None = None, runs=None) -> dict[str, tuple[float, str]]:
    """Each part's expected minutes on the H200 and where that comes from: the median recorded ``duration_s`` at
    today's fingerprint (plus ``START_MIN``); for a part measured by older code only, the longer of that record and
    its guess; else its guess, scaled by how the study's recorded parts compared with theirs. ``runs``: the
    study's ``RunSet``, where the caller has read it already."""
    runs = study_runs(study, root) if runs is None else runs
    guesses = parts_of(study)
    recorded, older = {}, {}  # part -> (median minutes, runs): at today's fingerprint, at older ones
    for part in guesses:
        for into, among in ((recorded, runs.runs if runs.current else ()), (older, (*runs.runs, *runs.older))):
            durations = [_recorded_s(r, study) for r in among if r.part == part and r.duration_s]
            if durations:
                into[part] = (statistics.median(durations) / 60, len(durations))
    # a part never run is guessed from the guesses of its study's parts that did run, scaled by how those compared
    # (Study 1's guesses ran 0.45-0.95 of their time on the H200): a guess twice too long packs half as many jobs
    scale = statistics.median(m / guesses[p] for p, (m, _) in recorded.items()) if recorded else 1.0
    out = {}
    for part, guess in guesses.items():
        if part in recorded:
            minutes, n = recorded[part]
            out[part] = (minutes + START_MIN, f"recorded ({n} runs)")
        elif part in older:
            # measured by older code only: the change may have lengthened it (Study 6's budget did)
            minutes, n = older[part]
            out[part] = (max(minutes, guess) + START_MIN, f"the longer of older code's record ({n} runs) and guess")
        elif recorded:
            out[part] = (guess * scale + START_MIN, f"guess x {scale:.2f} (the study's recorded parts)")
        else:
            out[part] = (guess + START_MIN, "guess")
    return out


def _recorded_s(run, study: str) -> float:
    """A run's recorded seconds; for a part that reads the distilled drafts, as if it had found them cached (a
    session's warm-up distils them, ``WARM_JOB``): the first such run of a session distilled them itself, and its
    ``models_s`` (timings.json) says for how long."""
    if run.part not in DRAFT_PARTS.get(study, ()):
        return run.duration_s
    try:
        models_s = float(json.loads((run.dir / "timings.json").read_text())["models_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return run.duration_s
    return run.duration_s - max(0.0, models_s - CACHED_DRAFTS_S)


def missing_engine_jobs(root: Path | None = None) -> list[Job]:
    """The engine page's runs with none complete at their measuring path's fingerprint today (``bench.jobs``)."""
    todo = engine_jobs.missing(Path(root or results_root()), START_MIN)
    return [Job(engine_jobs.STUDY, part, 0, round(minutes, 1), basis) for part, minutes, basis in todo]


def missing_multi_gpu_jobs(root: Path | None = None, repeats: int = MIN_REPEATS, gpus: int = 1) -> list[Job]:
    """The "Beyond one GPU" page's jobs missing today (``multi_gpu``); one that needs more than ``gpus`` GPUs is held
    back, with why."""
    out = []
    for job, rep, minutes, basis in multi_gpu.missing(Path(root or results_root()), repeats):
        held = "" if job.gpus <= gpus else (
            f"needs a machine of {job.gpus} GPUs (`status` lists the kinds lent; there, make gpu-plan GPUS={job.gpus})"
        )  # fmt: skip
        out.append(Job(multi_gpu.STUDY, job.part, rep, round(minutes + START_MIN, 1), basis, held))
    return out


def missing_jobs(study: str, repeats: int = MIN_REPEATS, root: Path | None = None, runs=None) -> list[Job]:
    """Every (part, repeat) of ``study`` with no complete run at today's fingerprint on the book's device. ``runs``:
    the study's ``RunSet``, where the caller has read it already."""
    runs = study_runs(study, root) if runs is None else runs
    have = {(r.part, r.repeat) for r in runs.runs} if runs.current else set()
    jobs = []
    for part, (minutes, basis) in estimates(study, root, runs).items():
        held = held_back(study, part)
        jobs += [Job(study, part, r, round(minutes, 1), basis, held) for r in range(repeats) if (part, r) not in have]
    return jobs


def rerun_jobs(root: Path | None = None, studies: tuple[str, ...] = RERUN_STUDIES) -> list[Job]:
    """Issue 27's re-run check (``rerun_check``): the GPU jobs of the cheapest re-run, by the plan's estimates,
    among the studies whose campaign is complete at today's fingerprint; [] once any study has a re-run there, or
    while none has its campaign's repeats."""
    best: list[Job] = []
    for study in studies:
        runs = study_runs(study, root)
        if not runs.current or len(rerun_check.whole_repeats(runs)) < MIN_REPEATS:
            continue
        if rerun_check.halves(runs) is not None:
            return []
        jobs = missing_jobs(study, rerun_check.RERUN_REPEATS, root, runs)
        if jobs and (not best or sum(j.minutes for j in jobs) < sum(j.minutes for j in best)):
            best = jobs
    return best


def _ffd(jobs: list[Job], max_minutes: float, bins: list[list[Job]] | None = None) -> list[list[Job]]:
    """First-fit decreasing of ``jobs`` into ``bins`` (given ones first, then new ones), each run's jobs in ``ORDER``
    with the warm-up first."""
    bins = [list(b) for b in bins or []]
    for job in sorted(jobs, key=lambda j: -j.minutes):
        for b in bins:
            if sum(j.minutes for j in b) + job.minutes <= max_minutes:
                b.append(job)
                break
        else:
            bins.append([job])
    order = {s: i for i, s in enumerate(ORDER)}
    return [sorted(b, key=lambda j: (not j.warm_up, order.get(j.study, 99), j.part, j.repeat)) for b in bins]


def pack(jobs: list[Job], max_minutes: float = MAX_MINUTES) -> list[list[Job]]:
    """First-fit decreasing into GPU runs of at most ``max_minutes``: the jobs that read SmolLM2 first, with the
    drafts' warm-up where any loads them (``WARM_JOB``), then the others, tier by tier (``claim_tiers``: the jobs
    that complete a seed claim soonest first), into the room those runs leave and then into runs of their own; a
    job larger than a run is refused (split the study into parts that fit). The runs with SmolLM2's jobs come last
    (`sessions` takes them first in a session, after the calls that stage its weights), the warm-up's first."""
    big = [j.name for j in jobs if j.minutes > max_minutes]
    if big:
        raise ParameterError(f"jobs longer than a GPU run ({max_minutes} min): {big}; split them into parts")
    smol_jobs = [j for j in jobs if j.smollm2]
    if any(j.drafts for j in smol_jobs) and not any(j.warm_up for j in smol_jobs):
        smol_jobs.insert(0, WARM_JOB)
    # SmolLM2's runs repeat by repeat (every part of repeat 0 first): a whole repeat shows on its page soonest
    smol = sorted(
        _ffd(smol_jobs, max_minutes),
        key=lambda b: (not any(j.warm_up for j in b), min((j.repeat, j.part) for j in b if j.smollm2)),
    )
    both = smol
    for tier in claim_tiers([j for j in jobs if not j.smollm2]):
        both = _ffd(tier, max_minutes, both)
    return both[len(smol) :] + both[: len(smol)]


# Claims judged on another study's page that read this study's parts: the simulator judges F2.3 on whole repeats of
# Study 1 (``s08_simulator.sources.study1_runs`` takes a repeat only with every part), so each of Study 1's parts,
# the budget sweep's too, gates F2.3 for its repeat
JUDGED_ELSEWHERE = {"01_scheduling": ("F2.3",)}


def claim_needs(study: str) -> dict[str, tuple[str, ...]]:
    """The parts each seed claim reads of ``study``'s (its report's ``NEEDS``; a study of one part reads it for
    every claim; a claim another page judges on this study's whole repeats, ``JUDGED_ELSEWHERE``, reads them all);
    {} for a study without seed claims (the simulator, the engine's bench)."""
    import importlib

    if not study[:2].isdigit() or study in ("08_simulator", multi_gpu.STUDY):
        return {}
    report = importlib.import_module(f"servelab.studies.s{study}.report")
    needs = getattr(report, "NEEDS", None)
    if needs is None:
        from servelab.studies.common.findings import not_measured

        parts = tuple(parts_of(study))
        needs = {f.id: parts for f in not_measured(study, "")}
    return dict(needs) | {claim: tuple(parts_of(study)) for claim in JUDGED_ELSEWHERE.get(study, ())}


def claim_tiers(jobs: list[Job]) -> list[list[Job]]:
    """``jobs`` in tiers, the first packed first: a job's tier is the fewest missing jobs among the seed claims that
    read its part (a claim whose last jobs these are is judged soonest, so the book's verdicts come before the
    parts that no claim reads); jobs that no claim reads come next, the Beyond-one-GPU page's last."""
    rank: dict[Job, float] = {}
    for study in dict.fromkeys(j.study for j in jobs):
        mine = [j for j in jobs if j.study == study]
        for parts in claim_needs(study).values():
            waiting = [j for j in mine if j.part in parts]
            for j in waiting:
                rank[j] = min(rank.get(j, math.inf), len(waiting))
    tiers: dict[tuple[bool, float], list[Job]] = {}
    for j in jobs:
        # the Beyond-one-GPU page's jobs after every study's: the seed's studies are the book's first debt
        tiers.setdefault((j.study == multi_gpu.STUDY, rank.get(j, math.inf)), []).append(j)
    return [tiers[k] for k in sorted(tiers)]


def run_minutes(run: list[Job]) -> float:
    """A GPU run's expected device minutes; a run of no jobs is a staging call, which carries a part only."""
    return sum(j.minutes for j in run) if run else STAGE_CALL_MIN


def sessions(
    bins: list[list[Job]], parts: int, session_minutes: float = SESSION_MINUTES, max_minutes: float = MAX_MINUTES
) -> list[list[list[Job]]]:
    """The runs laid out over sessions of ``session_minutes`` of device time each (a session's machine starts
    bare). While runs that read SmolLM2 remain, a session opens with ``parts`` - 1 staging calls, which carry the
    first parts of its weights and run nothing, then takes those runs, then others where time is left. SmolLM2's
    runs go first, because every run committed grows the tree that each call carries beside a part, and with it
    the number of parts; a staging call costs about half a minute. A session's first run that reads the distilled
    drafts starts with the warm-up job (``WARM_JOB``), in that run where it fits, else in a run of its own before it:
    the drafts' cache lives on the machine, which each session gets bare."""
    plain = [b for b in bins if not any(j.smollm2 for j in b)]
    smol = [b for b in bins if any(j.smollm2 for j in b)]
    out: list[list[list[Job]]] = []
    while plain or smol:
        session: list[list[Job]] = [[] for _ in range(parts - 1)] if smol else []
        used = sum(run_minutes(r) for r in session)
        warm = False
        for queue in (smol, plain):
            for b in list(queue):
                runs = [b]
                if not warm and any(j.drafts for j in b):
                    fits = run_minutes(b) + WARM_JOB.minutes <= max_minutes
                    runs = [[WARM_JOB, *b]] if fits else [[WARM_JOB], b]
                cost = sum(run_minutes(r) for r in runs)
                if used + cost <= session_minutes or not any(session):
                    session += runs
                    used += cost
                    queue.remove(b)
                    warm = warm or any(j.warm_up for r in runs for j in r)
        out.append(session)
    return out


def _carry(session: list[list[Job]], i: int, parts: int) -> str:
    """What call ``i`` of a session names in ``carry``: the wheels, and where the session runs SmolLM2, part ``i``
    until the last, with the hash. The wheels go with every call but a later part's (``common.carry`` sizes those
    parts to fill a call alone; staging relies on the machine staying warm between its calls, /tmp/stage and
    /tmp/site with it): a machine goes back after about 30 s idle, and a fresh one lacks what the last call
    installed in /tmp/site."""
    staging_later_part = any(j.smollm2 for r in session for j in r) and 0 < i < parts
    names = [] if staging_later_part else [".whl"]
    if any(j.smollm2 for r in session for j in r) and i < parts:
        names.append(f".models/smollm2/p{i}")
        if i == parts - 1:
            names.append(".models/smollm2/SHA256")
    return " ".join([*names, ".revision"])


def plan_text(
    bins: list[list[Job]],
    max_minutes: float = MAX_MINUTES,
    held: list[Job] = (),
    parts: int | None = None,
    growth: bool = False,
) -> str:
    """The plan as `make gpu-plan` prints it, session by session, each call with what it carries; ``held``: the
    jobs that must wait, listed after the runs with why; ``parts``: the calls SmolLM2's weights take (default: at
    this checkout's tree, `carry.smollm2_parts`); ``growth``: with the tree's forecast over the plan
    (``tree_growth``), which reads every run folder on disk."""
    wait = _held_text(held)
    if not bins:
        return "GPU plan: nothing to measure now; every study has its repeats at today's fingerprints.\n" + wait
    smol = any(j.smollm2 for b in bins for j in b)
    parts = (carry.smollm2_parts() if smol else 1) if parts is None else parts
    laid = sessions(bins, parts, max_minutes=max_minutes)
    runs = [r for s in laid for r in s if r]
    total = sum(j.minutes for r in runs for j in r)
    warm = sum(j.warm_up for r in runs for j in r)
    lines = [
        f"GPU plan: {sum(not j.warm_up for b in bins for j in b)} jobs{f' and {warm} warm-up' if warm else ''},"
        f" {total:.1f} min in {len(runs)} GPU runs of <= {max_minutes} min, over {len(laid)} sessions of"
        f" {SESSION_MINUTES:.0f} min device time"
    ]
    lines.append(
        "Each call refuses at once on a GPU other than the H200 (scripts/gpu_run.sh exits 3; the device tool lends"
        " H100s too): append `|| [ $? -ne 3 ] || make gpu-test-quick` to spend such a machine on the exactness tests,"
        " or `|| [ $? -ne 3 ] || SERVELAB_ANY_GPU=1 scripts/gpu_run.sh JOBS` to dry-run the same jobs at today's code"
        " there (their runs name that card, so keep what they show in data/dev, never in data/results)."
    )
    if smol:
        lines.append(
            f"SmolLM2: the jobs so marked read its GGUF, which takes {parts} calls to carry at this tree"
            " (scripts/stage_smollm2.sh cuts the parts after the last commit): a session's calls carry them in"
            " order, back to back (the machine goes back after 30 s idle), and its SmolLM2 runs come after them."
        )
    if growth:
        from servelab.studies.common.tree_growth import forecast

        lines.append(forecast([j for b in bins for j in b]).text())
    if warm:
        lines.append(
            f"Drafts: {WARM_JOB.name} distils SmolLM2's drafts into the machine's cache (writes no data), where the"
            " jobs so marked load them; it runs before them in each session, since a session's machine starts bare."
        )
    k = 0
    for n, session in enumerate(laid, 1):
        lines.append(f"\nSession {n}: {sum(run_minutes(r) for r in session):.1f} min")
        for i, b in enumerate(session):
            k += bool(b)
            head = f"GPU run {k}: {run_minutes(b):.1f} min" if b else "staging call (no jobs)"
            lines.append(f"  {head}; carry {_carry(session, i, parts)}")
            lines += [
                f"    {j.name:<34} {j.minutes:5.1f} min  ({j.basis}){'  SmolLM2' if j.smollm2 else ''}"
                f"{'  drafts' if j.drafts else ''}"
                for j in b
            ]
            lines.append("    scripts/gpu_run.sh " + (" ".join(j.name for j in b) if b else "  # stages the part only"))
    return "\n".join(lines) + "\n" + wait


def _held_text(held: list[Job]) -> str:
    if not held:
        return ""
    lines = [f"\nHeld back, {len(held)} jobs ({sum(j.minutes for j in held):.1f} min) that must wait:"]
    for why in dict.fromkeys(j.held for j in held):
        parts: dict[str, list[int]] = {}  # a part's repeats on one name: study:part:0,1,2
        for j in held:
            if j.held == why:
                parts.setdefault(f"{j.study}:{j.part}", []).append(j.repeat)
        names = ", ".join(f"{p}:{','.join(map(str, reps))}" for p, reps in parts.items())
        lines.append(f"  {names}: {why}")
    return "\n".join(lines) + "\n"


def run_job(study: str, part: str, repeat: int, profile: str = "full") -> Path:
    """One job in this process: the study's ``profile`` (the H200's: full) with seed = default + ``repeat``."""
    from servelab.studies.common.study import door

    params = door(study, "params")
    base = params.DEFAULTS[profile].get("seed", 0)
    P = params.study_params(profile, seed=base + repeat, repeat=repeat, part=part)
    return door(study, "measure").measure(P)


def _resolve(study: str, part: str, rep: int, profile: str) -> tuple[float, float, list[str]]:
    """A job's guessed and expected minutes and the command that runs it in a fresh process, by its kind: the
    drafts' warm-up, one of the engine page's runs, or a part of a study's repeat."""
    if study == WARM_STUDY:
        if part != WARM_PART:
            raise ParameterError(f"the warm-up job is {WARM_JOB.name}, got {study}:{part}:{rep}")
        module = warm_drafts.__name__
        return WARM_JOB.minutes, WARM_JOB.minutes, [sys.executable, "-m", module, profile]
    if study == engine_jobs.STUDY:
        if part not in engine_jobs.JOBS:
            raise ParameterError(f"{study} has no part {part!r}; its parts: {sorted(engine_jobs.JOBS)}")
        guess = engine_jobs.JOBS[part].guess_min
        expected = next((m for p, m, _ in engine_jobs.missing(results_root(), START_MIN) if p == part), guess)
        return guess, expected, engine_jobs.JOBS[part].command()
    if study == multi_gpu.STUDY:
        if part not in multi_gpu.JOBS:
            raise ParameterError(f"{study} has no part {part!r}; its parts: {sorted(multi_gpu.JOBS)}")
        job = multi_gpu.JOBS[part]
        expected = multi_gpu.recorded_min(results_root(), part) or job.guess_min
        return job.guess_min, expected + START_MIN, job.command(rep)
    guess = parts_of(study).get(part)
    if guess is None:
        raise ParameterError(f"{study} has no part {part!r}; its parts: {sorted(parts_of(study))}")
    cmd = [sys.executable, "-m", "servelab.studies.common.campaign", "job", study, part, str(rep), "--profile", profile]
    expected = estimates(study).get(part, (guess, ""))[0]
    if part in DRAFT_PARTS.get(study, ()) and not warm_drafts.warmed(profile):
        expected += WARM_JOB.minutes  # no warm-up ran on this machine: the part distils its drafts first
    return guess, expected, cmd


def run_jobs(
    names: list[str], *, limit_s: float | None = None, profile: str = "full", deadline: float | None = None
) -> int:
    """Each job in a fresh process, in order, each cut at ``limit_s`` seconds (default: its expected time × 2 + 2
    min); returns the number that failed. A job cut off leaves an incomplete folder, which no page reads.
    ``deadline`` (a ``time.time()``; default ``$SERVELAB_RUN_DEADLINE``, which gpu_run.sh sets where the call's
    limit cuts the run): a job expected to run past it is not started (rc=4), since it would only be cut, and the
    device time it took would buy nothing (a 2026-12-04 call lost 167 s so)."""
    if deadline is None and os.environ.get("SERVELAB_RUN_DEADLINE"):
        deadline = float(os.environ["SERVELAB_RUN_DEADLINE"])
    failed = 0
    for name in names:
        study, part, rep = parse_job(name)
        guess, expected, cmd = _resolve(study, part, rep, profile)
        limit = limit_s or (guess * 2 + 2) * 60
        if deadline is not None and time.time() + expected * 60 > deadline:
            failed += 1
            print(
                f"job {name} rc=4 0s not started: expected {expected * 60:.0f} s, {deadline - time.time():.0f} s left"
                " before the call's limit",
                flush=True,
            )
            continue
        lacking = missing_here(study, part)
        if lacking:
            failed += 1
            print(f"job {name} rc=3 0s not run: {lacking}", flush=True)
            continue
        t0 = time.monotonic()
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
    p.add_argument("--gpus", type=int, default=1, help="GPUs on the machine the plan is for (the Beyond-one-GPU jobs)")
    p.add_argument("--jobs-only", action="store_true", help="print only the job names, one line")
    p.add_argument("studies", nargs="*", help="only these studies, engine among them (default: all)")
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
            if a.repeats < 1 or a.gpus < 1 or not math.isfinite(a.max_minutes) or a.max_minutes <= 0:
                raise ParameterError("--repeats and --gpus must be >= 1 and --max-minutes > 0")
            studies = a.studies or [*campaign_studies(), engine_jobs.STUDY, multi_gpu.STUDY]
            root = a.results or results_root()
            special = (engine_jobs.STUDY, multi_gpu.STUDY)
            jobs = [job for s in studies if s not in special for job in missing_jobs(s, a.repeats, root)]
            jobs += missing_engine_jobs(root) if engine_jobs.STUDY in studies else []
            jobs += missing_multi_gpu_jobs(root, a.repeats, a.gpus) if multi_gpu.STUDY in studies else []
            if not a.studies and a.repeats == MIN_REPEATS:  # the whole plan: with it, issue 27's re-run check
                jobs += [replace(j, basis=f"{j.basis}; re-run check") for j in rerun_jobs(root)]
            ready, held = [j for j in jobs if not j.held], [j for j in jobs if j.held]
            if a.jobs_only:
                print(" ".join(j.name for b in pack(ready, a.max_minutes) for j in b))
            else:
                print(plan_text(pack(ready, a.max_minutes), a.max_minutes, held, growth=True), end="")
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
