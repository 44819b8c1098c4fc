"""Each study's report computed once per state of the code and the data, however many readers ask for it.

``make book`` needs every report twice over: each page's render runs its study's report in a notebook kernel, then
``servelab_book prepare`` runs them all again for the landing table, and the controlled-acceptance page runs Study 3's
a third time. A report is a pure function of the library's code and the files under the results root, so its record
is kept (pickled under ``.cache/reports/``, which git ignores) under a key made of exactly those: the text of every
``lib/servelab`` source file, the path, size and modification time of every file under the results root and the
seed data, and the interpreter's and pandas' versions (a pickle is only read back by the versions that wrote it).
Any edit, new run or checkout changes the key, and the report is computed afresh: a hit can only return what
recomputing would. ``SERVELAB_REPORT_CACHE=0`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from servelab.measure.results import results_root as results_root_default
from servelab.paths import DATA_DIR, REPO_ROOT
from servelab.studies.common.runs import RunSet

CACHE_DIR = REPO_ROOT / ".cache" / "reports"
LIB = Path(__file__).resolve().parents[3]  # lib/, holding servelab


def enabled() -> bool:
    return os.environ.get("SERVELAB_REPORT_CACHE", "1") != "0"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if root.is_dir() else []


@functools.cache
def _code_digest() -> str:
    """Every ``lib/servelab`` source file, hashed once per process: a process that builds the book reads many
    records (each report and its published value), and the code does not change under it."""
    h = hashlib.sha256()
    for path in _files(LIB / "servelab"):
        if path.suffix == ".py":
            h.update(str(path.relative_to(LIB)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def state_key(name: str, runs: RunSet) -> str:
    """The key of the record ``name`` over ``runs``: the runs chosen, the code, every data file, the versions."""
    import pandas as pd

    results_root = Path(runs.results_root or results_root_default())
    h = hashlib.sha256(f"{name}\0{results_root.resolve()}\0{sys.version}\0{pd.__version__}\0".encode())
    for r in runs.runs:
        h.update(f"{r.dir}\0".encode())
    h.update(_code_digest().encode())
    for root in (Path(results_root), DATA_DIR / "seed", DATA_DIR / "models"):
        for path in _files(root):
            st = path.stat()
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def cached(name: str, runs: RunSet, compute: Callable[[], object], cache_dir: Path | None = None):
    """``compute()`` (a study's report over ``runs``, or another pure function of them, named ``name``: the study's
    slug for its report), or the record an earlier call with the same key kept."""
    if not enabled():
        return compute()
    folder = Path(cache_dir or CACHE_DIR)
    path = folder / f"{name}-{state_key(name, runs)}.pkl"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass  # no record yet, or one an older layout of the classes cannot read: compute
    record = compute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # written whole, then renamed: a page rendering in parallel never reads half a record
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as tmp:
            try:
                pickle.dump(record, tmp)
            except Exception:
                os.unlink(tmp.name)
                raise
        os.replace(tmp.name, path)
        for old in folder.glob(f"{name}-*.pkl"):  # records of earlier states are never read again
            if old != path:
                old.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # a read-only checkout or an unpicklable record: the report is still right, only not kept
    return record
