"""Run a study as independent repeats, each a fresh papermill process with its own seed, and combine their verdicts.

    python -m servelab.studies.common.repeat_runs 02_gpu_costs --repeats 3 [--profile full] [-p name value ...]

Repeat ``r`` runs the study notebook with ``seed`` = base seed + ``r`` (the base: ``-p seed`` if given, else 0, the
seed of every study's profiles) and writes its results to ``<results>/<device>/<NN_study>/repeats/r<r>/``
(``measure.results`` reads the set from the environment this module sets). Then ``combine_set``:

- ``findings.csv`` of the study's folder: one row per claim, combined over the repeats by
  ``studies.common.repeats.combine_repeats`` (median and interval of each repeat's ``headline``, the one number its
  verdict was decided on, else of the measured values where they are numbers; the verdict ``inconclusive`` where
  repeats disagree), with ``repeats``, ``repeat_verdicts`` and ``spread``; a measured value that is text keeps the
  last repeat's text with each of its numbers the median over the repeats (``text_medians``);
- ``repeats.csv``: one row per claim and repeat (the repeat's seed, verdict, measured value and headline);
- every other file of the **last** repeat beside them, and its ``run.json`` with a ``repeats`` record.

The book's page is the last repeat's executed notebook: it is the only one that runs when every other repeat has
finished, so it alone can show the combined verdicts (``studies.common.page.with_repeats``); the data beside the
combined findings are the same repeat's, so the page's tables and the folder agree. The earlier repeats' pages go to a
scratch folder (``--pages``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.measure.results import findings_frame, repeat_folder, results_root
from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import Finding
from servelab.studies.common.repeats import INCONCLUSIVE, MIN_REPEATS, combine_repeats, median_interval

MISSING = "missing"  # a repeat that judged no such claim (its measurement skipped), in repeat_verdicts


def page_path(study: str) -> Path:
    """Where the book keeps a study's executed page (08_simulator is the simulator page, not a study)."""
    return REPO_ROOT / "book" / ("simulator.ipynb" if study == "08_simulator" else f"studies/{study}.ipynb")


def set_folders(token: str, root: Path | None = None) -> dict[Path, list[Path]]:
    """The set ``token``'s repeat folders, by study folder (``<root>/<device>/<NN_study>``), in repeat order.

    Only folders whose ``run.json`` names the set count, so an older set's repeats are never mixed in.
    """
    found: dict[Path, dict[int, Path]] = {}
    for side in Path(root or results_root()).glob("*/*/repeats/r*/run.json"):
        rep = json.loads(side.read_text()).get("repeat") or {}
        if rep.get("set") == token:
            found.setdefault(side.parent.parent.parent, {})[int(rep["index"])] = side.parent
    return {study: [reps[i] for i in sorted(reps)] for study, reps in found.items()}


def read_findings(folder: Path) -> list[Finding]:
    """A repeat's ``findings.csv`` as ``Finding`` records (every column as text, as it was written)."""
    df = findings_frame(pd.read_csv(folder / "findings.csv", dtype=str, keep_default_na=False).to_dict("records"))
    return [Finding(**{**row, "repeats": int(row["repeats"])}) for row in df.to_dict("records")]


NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")  # 1,559 / -0.60 / +20 / 36.34


def _is_number(text: str) -> bool:
    return NUMBER.fullmatch(text.strip()) is not None


def _median_token(tokens: Sequence[str]) -> str:
    """The median of one number's tokens over the repeats, written as they were (decimals, thousands, sign); the
    token itself where every repeat wrote the same."""
    if len(set(tokens)) == 1:
        return tokens[0]
    xs = sorted(float(t.replace(",", "")) for t in tokens)
    med = median_interval(xs).median
    decimals = max(len(t.split(".")[1]) if "." in t else 0 for t in tokens)
    text = f"{med:,.{decimals}f}" if any("," in t for t in tokens) else f"{med:.{decimals}f}"
    return f"+{text}" if med >= 0 and any(t.startswith("+") for t in tokens) else text


def text_medians(values: Sequence[str]) -> str | None:
    """Text values of one shape ("1.44× at 512 tokens (IQR 1.41–1.46×)") with each number the median over the
    repeats; None where the repeats' texts differ in more than their numbers."""
    shapes = {NUMBER.sub("#", v) for v in values}
    if len(shapes) != 1:
        return None
    columns = zip(*(NUMBER.findall(v) for v in values), strict=True)
    parts = NUMBER.split(values[-1])
    return parts[0] + "".join(_median_token(col) + rest for col, rest in zip(columns, parts[1:], strict=True))


def _combine_text(present: Sequence[Finding]) -> Finding:
    """A claim whose measured values are text: ``combine_repeats`` on the verdicts, each number of the text the
    median over the repeats (``text_medians``) where the texts share a shape, and every repeat's text in the note."""
    medians = text_medians([f.measured_value for f in present])
    same = [replace(f, measured_value=present[-1].measured_value) for f in present]
    out = combine_repeats(same)
    values = "; ".join(f"r{i}: {f.measured_value}" for i, f in enumerate(present))
    how = "each number the median over the repeats" if medians is not None else "the last repeat's value"
    return replace(out, measured_value=medians or present[-1].measured_value, note=f"{out.note} [{how}; {values}]")


def _combine_claim(found: Sequence[Finding | None]) -> Finding:
    """One claim over the repeats (None: a repeat without it). Numbers: ``combine_repeats``; text: ``_combine_text``;
    a claim some repeat did not judge: ``inconclusive``, with the repeats that did."""
    present = [f for f in found if f is not None]
    if len(present) == len(found):
        if all(_is_number(f.measured_value) for f in present) or len({f.measured_value for f in present}) == 1:
            return combine_repeats(present)
        return _combine_text(present)
    verdicts = [f.verdict if f else MISSING for f in found]
    last = present[-1]
    return replace(
        last,
        verdict=INCONCLUSIVE,
        note=f"{last.note} [judged in {len(present)} of {len(found)} repeats: {'; '.join(verdicts)}]",
        repeats=len(present),
        repeat_verdicts=";".join(verdicts),
        spread="",
    )


def combine_findings(per_repeat: Sequence[Sequence[Finding]]) -> list[Finding]:
    """Every claim any repeat judged, combined over the repeats, in the order the repeats list them."""
    if len(per_repeat) < MIN_REPEATS:
        raise ParameterError(f"a verdict needs at least {MIN_REPEATS} repeats, got {len(per_repeat)}")
    by_id = [{f.id: f for f in fs} for fs in per_repeat]
    ids = list(dict.fromkeys(f.id for fs in per_repeat for f in fs))
    return [_combine_claim([m.get(i) for m in by_id]) for i in ids]


def repeats_table(folders: Sequence[Path], per_repeat: Sequence[Sequence[Finding]]) -> pd.DataFrame:
    """One row per claim and repeat: the repeat's index, seed, folder, verdict, measured value and headline."""
    rows = []
    for i, (folder, fs) in enumerate(zip(folders, per_repeat, strict=True)):
        seed = json.loads((folder / "run.json").read_text()).get("params", {}).get("seed")
        rows += [
            {"id": f.id, "repeat": i, "seed": seed, "folder": f"{repeat_folder(i)}", "verdict": f.verdict}
            | {"measured_value": f.measured_value, "unit": f.unit}
            | {"headline": f.headline, "headline_unit": f.headline_unit}
            for f in fs
        ]
    columns = ["id", "repeat", "seed", "folder", "verdict", "measured_value", "unit", "headline", "headline_unit"]
    return pd.DataFrame(rows, columns=columns)


def combine_set(study_dir: Path, folders: Sequence[Path]) -> list[Finding]:
    """Write the study folder's combined ``findings.csv``, ``repeats.csv`` and the last repeat's other files and
    ``run.json`` (with a ``repeats`` record); the combined findings returned."""
    per_repeat = [read_findings(f) for f in folders]
    combined = combine_findings(per_repeat)
    last = folders[-1]
    side = json.loads((last / "run.json").read_text())
    _clear_own_files(study_dir)
    for f in sorted(last.iterdir()):
        if f.is_file() and f.name not in ("findings.csv", "run.json"):
            shutil.copy2(f, study_dir / f.name)
    findings_frame([f.row() for f in combined]).to_csv(study_dir / "findings.csv", index=False)
    repeats_table(folders, per_repeat).to_csv(study_dir / "repeats.csv", index=False)
    rep = side.pop("repeat")
    seeds = [json.loads((f / "run.json").read_text()).get("params", {}).get("seed") for f in folders]
    side["repeats"] = {"set": rep["set"], "n": len(folders), "seeds": seeds, "page": repeat_folder(len(folders) - 1)}
    side["files"] = list(dict.fromkeys([*side.get("files", []), "findings.csv", "repeats.csv"]))
    (study_dir / "run.json").write_text(json.dumps(side, indent=2) + "\n")
    _drop_other_sets(study_dir, rep["set"])
    return combined


def _clear_own_files(study_dir: Path) -> None:
    """Remove the files the study's previous top-level run wrote (its sidecar's list), so none outlives it; files
    other studies wrote here (``<study>/<name>.csv`` entries of their sidecars) are kept."""
    side = study_dir / "run.json"
    if not side.exists():
        return
    for name in json.loads(side.read_text()).get("files", []):
        if "/" not in name:
            (study_dir / name).unlink(missing_ok=True)


def _drop_other_sets(study_dir: Path, token: str) -> None:
    """Remove repeat folders an older, larger set left (r3 of a set of 5 when this set has 3)."""
    for folder in (study_dir / "repeats").glob("r*"):
        if not re.fullmatch(r"r\d+", folder.name) or not folder.is_dir():
            continue
        try:
            theirs = (json.loads((folder / "run.json").read_text()).get("repeat") or {}).get("set")
        except (OSError, ValueError):
            theirs = None
        if theirs != token:
            shutil.rmtree(folder)


def _papermill(notebook: Path, out: Path, params: dict, env: dict, log) -> int:
    cmd = [sys.executable, "-m", "papermill", "--cwd", str(notebook.parent), str(notebook), str(out)]
    for k, v in params.items():
        cmd += ["-p", k, str(v)]
    cmd += ["--log-output", "--no-progress-bar"]
    print("$", " ".join(cmd), file=log, flush=True)
    return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def run_repeats(
    study: str,
    repeats: int,
    params: dict,
    *,
    notebook: Path | None = None,
    page: Path | None = None,
    pages: Path | None = None,
    log=None,
) -> list[Finding]:
    """Run ``study``'s notebook ``repeats`` times, each a fresh papermill process with seed = base + r, then
    combine the set (``combine_set``). ``params``: papermill parameters (strings as papermill's ``-p`` reads them);
    ``page``: where the last repeat's executed notebook goes; ``pages``: the earlier repeats' (scratch)."""
    if repeats < MIN_REPEATS:
        raise ParameterError(f"a verdict needs at least {MIN_REPEATS} repeats, got --repeats {repeats}")
    notebook = Path(notebook or REPO_ROOT / "notebooks" / f"{study}.ipynb")
    if not notebook.exists():
        raise ParameterError(f"no notebook {notebook} for study {study!r}")
    page = Path(page or page_path(study))
    pages = Path(pages or tempfile.mkdtemp(prefix=f"repeats_{study}_"))
    base = int(params.pop("seed", 0))
    token = f"{study}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    log = log or sys.stdout
    for r in range(repeats):
        env = os.environ | {"SERVELAB_REPEAT_SET": token, "SERVELAB_REPEAT": str(r), "SERVELAB_REPEATS": str(repeats)}
        out = page if r == repeats - 1 else pages / f"{study}.r{r}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        rc = _papermill(notebook, out, {**params, "seed": base + r}, env, log)
        if rc != 0:
            raise RuntimeError(f"{study}: repeat {r} (seed {base + r}) failed with exit status {rc}; see {out}")
    found = set_folders(token)
    if len(found) != 1:
        raise RuntimeError(f"{study}: the set {token} wrote findings in {len(found)} study folders: {sorted(found)}")
    ((study_dir, folders),) = found.items()
    if len(folders) != repeats:
        raise RuntimeError(f"{study}: {len(folders)} of {repeats} repeats wrote results under {study_dir}")
    return combine_set(study_dir, folders)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", help="the notebook's name, e.g. 02_gpu_costs")
    ap.add_argument("--repeats", "-r", type=int, default=MIN_REPEATS, help="independent repeats (at least 3)")
    ap.add_argument("--profile", default="auto", choices=["auto", "full", "smoke"])
    ap.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--notebook", type=Path, help="the notebook (default notebooks/<study>.ipynb)")
    ap.add_argument("--page", type=Path, help="the last repeat's executed notebook (default: the book's page)")
    ap.add_argument("--pages", type=Path, help="folder for the earlier repeats' executed notebooks (default: scratch)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    params = {"profile": a.profile, **dict(a.param)}
    combined = run_repeats(a.study, a.repeats, params, notebook=a.notebook, page=a.page, pages=a.pages)
    for f in combined:
        print(f"{f.id}: {f.verdict} ({f.repeat_verdicts}) {f.measured_value} {f.unit} {f.spread}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
