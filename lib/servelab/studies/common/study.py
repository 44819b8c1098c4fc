"""A study's two doors, and the one call a study notebook makes.

Every study package ``servelab.studies.s<NN_name>`` has the same two entry points:

- ``measure.measure(P) -> Path``: the **measuring path**, run on the GPU. It writes one run folder of raw tidy CSVs
  and ``run.json`` (``measure.results.StudyResults(..., measuring=__name__)``) and returns it. It imports nothing
  that reports (no verdicts, plots or page text), so that those can change without making its data stale.
  ``measure.PARTS`` maps each part of the study to its expected minutes on the H200, the plan's first guess
  before a run has recorded its duration (``common.campaign``);
- ``report.report(runs: RunSet)``: the **reporting path**, run on a CPU at every book build. It reads only the runs'
  files and returns the page's record: verdicts by today's rules, tables, figures, and every number the prose quotes.

``page`` is the notebook's one call: profile ``"replay"`` (the book's) measures nothing and reports the committed
runs; any other profile measures first, then reports the runs of that fingerprint on that device.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from servelab.studies.common.params import REPLAY, overrides_from
from servelab.studies.common.quiet import quiet_run
from servelab.studies.common.report_cache import cached
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.common.style import use_book_style


def package(study: str) -> str:
    """``02_gpu_costs`` -> ``servelab.studies.s02_gpu_costs``."""
    return f"servelab.studies.s{study}"


def door(study: str, name: str):
    """One of the study's modules: ``params``, ``measure`` or ``report``."""
    return importlib.import_module(f"{package(study)}.{name}")


def measure(study: str, profile: str, **overrides) -> Path:
    """Run the study's measuring path in this process with ``study_params(profile, **overrides)``; its run folder."""
    params = door(study, "params")
    P = params.study_params(profile, **overrides)
    return door(study, "measure").measure(P)


def runs_of(run_dir: Path) -> RunSet:
    """The run set a freshly measured run belongs to: its study's runs at its fingerprint, on its device."""
    run_dir = Path(run_dir)
    study_dir = run_dir.parents[3]  # <device>/<study>/runs/<fingerprint>/<part>/r<k>
    return study_runs(study_dir.name, study_dir.parents[1], device=study_dir.parent.name)


def page(study: str, profile: str, namespace: Mapping | None = None, *, root: Path | None = None):
    """What a study notebook shows: ``report(runs)`` over the committed runs (``profile="replay"``), or over the runs
    of the fingerprint just measured (any other profile, with the notebook's parameters from ``namespace``)."""
    use_book_style()
    with quiet_run():
        if profile == REPLAY:
            runs = study_runs(study, root)
            return cached(study, runs, lambda: door(study, "report").report(runs))
        else:
            params = door(study, "params")
            overrides = overrides_from(namespace or {}, params.DEFAULTS)
            runs = runs_of(door(study, "measure").measure(params.study_params(profile, **overrides)))
        return door(study, "report").report(runs)
