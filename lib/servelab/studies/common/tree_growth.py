"""How the tracked tree grows over a GPU plan, and what that leaves a call for SmolLM2's weights.

Every device call carries the tracked tree within 64 MiB (``carry``), and every job commits a run folder. Study 1's
three repeats alone held 19 MB at one fingerprint, so a whole campaign can take the tree past the limit, after
which no call carries it, and long before that SmolLM2's weights take a call for every few MB the tree leaves. The
plan prints this forecast: the bytes its jobs add (each sized by the runs its part already has on disk, at any
fingerprint, compressed as committed), and the bytes that ``make prune-runs`` takes back once each of the plan's
studies has its repeats at today's fingerprint (its older fingerprints' folders, less ``legacy`` and the simulator
freeze's pins: ``pins.kept_out``, the rule ``prune.superseded`` applies, ahead of time).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from servelab.studies.common import carry
from servelab.studies.common.pins import kept_out
from servelab.studies.common.runs import study_runs


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


@dataclass(frozen=True)
class Forecast:
    tree: int  # bytes carried today
    added: int  # bytes the plan's sized jobs are expected to commit
    unsized: int  # jobs with no run of their part on disk to size them by (counted as adding nothing)
    prunable: int  # bytes make prune-runs can take back once the plan's studies are complete

    @property
    def end(self) -> int:
        return self.tree + self.added - self.prunable

    def text(self) -> str:
        mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
        unsized = f" ({self.unsized} jobs with no earlier run are not counted)" if self.unsized else ""
        head = (
            f"Tree: {mb(self.tree)} carried by every call now; the plan's runs add about {mb(self.added)}{unsized},"
            f" and make prune-runs takes back {mb(self.prunable)} as its studies complete: about {mb(self.end)} at"
            f" the end, of the {carry.CALL_LIMIT / 2**20:.0f} MiB a call carries"
        )
        try:
            parts = carry.smollm2_parts(tree=self.end)
        except ValueError:
            return head + ". That leaves no room for SmolLM2's weights: prune, or shrink what the runs write."
        return head + f" (SmolLM2's weights would take {parts} calls then)."


def forecast(jobs: Iterable, root: Path | None = None, tree: int | None = None, pins: Path | None = None) -> Forecast:
    """The tree's growth over ``jobs`` (``campaign.Job``s; engine and warm-up jobs write no run folder that stays:
    the engine page's files are rewritten in place)."""
    jobs = [j for j in jobs if not j.warm_up]
    added = unsized = prunable = 0
    sizes: dict[tuple[str, str], int | None] = {}
    for study in dict.fromkeys(j.study for j in jobs):
        try:
            runs = study_runs(study, root)
        except ModuleNotFoundError:  # the engine page: no measuring module of a study's name
            continue
        for part in {j.part for j in jobs if j.study == study}:
            found = [folder_bytes(r.dir) for r in (*runs.runs, *runs.older) if r.part == part]
            sizes[study, part] = int(statistics.median(found)) if found else None
        today = runs.today.digest if runs.today is not None else None
        folders = {r.dir.parents[1] for r in (*runs.runs, *runs.older) if r.fingerprint != today}
        prunable += sum(folder_bytes(f) for f in kept_out(folders, study, pins))
    for j in jobs:
        size = sizes.get((j.study, j.part), 0)
        added += size or 0
        unsized += size is None
    here = carry.tree_bytes() if tree is None else tree
    return Forecast(here or 0, added, unsized, prunable)
