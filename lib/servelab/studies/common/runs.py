"""The reporting path's input: every measured run of one study at one fingerprint, read from disk only.

A study's measuring path (``<study>.measure.measure``) writes one run folder per call,
``data/results/<device>/<NN_study>/runs/<fingerprint>/<part>/r<repeat>/``, with tidy CSVs and ``run.json``
(``measure.results.StudyResults`` with ``measuring=``). ``study_runs`` gathers the complete runs of the study's
**current** fingerprint (its measuring module's import closure hashed today) when there are any, else of the most
recently measured one; then the page is stale, and ``RunSet.changed`` names the measuring files that differ.

A repeat is a set of parts with the same repeat index: one independent measurement of the whole study (fresh
processes, its own seed). ``RunSet.per_repeat`` splits the set that way; ``combine`` turns each repeat's findings
into the finding a page shows (``studies.common.repeats``): the median and interval of the headlines, and
**inconclusive** where repeats disagree or where fewer than ``MIN_REPEATS`` exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import pandas as pd

from servelab.measure.fingerprint import Fingerprint, fingerprint
from servelab.measure.results import RUNS, results_root
from servelab.studies.common.findings import Finding, not_measured, repeat_label, repeat_name, repeats_name
from servelab.studies.common.repeats import INCONCLUSIVE, MIN_REPEATS, combine_repeats

BOOK_DEVICE = "h200"  # the book's runs: device folders whose slug contains it
MISSING = "missing"  # a repeat that judged no such claim, in repeat_verdicts
ALL_PARTS = "all"  # the part of a run that measured every part (a study without parts, or a legacy run)


def measuring_module(study: str) -> str:
    """The measuring module of ``study`` by the studies' convention: ``02_gpu_costs`` ->
    ``servelab.studies.s02_gpu_costs.measure``."""
    return f"servelab.studies.s{study}.measure"


@dataclass(frozen=True)
class Run:
    """One measured run: a folder with its ``run.json``."""

    dir: Path
    meta: dict

    @property
    def part(self) -> str:
        return str(self.meta.get("part", ALL_PARTS))

    @property
    def repeat(self) -> int:
        return int(self.meta.get("repeat_index", 0))

    @property
    def fingerprint(self) -> str:
        return str(self.meta.get("fingerprint", ""))

    @property
    def seed(self):
        return self.meta.get("seed", (self.meta.get("params") or {}).get("seed"))

    @property
    def commit(self) -> str:
        return str(self.meta.get("git_commit", ""))

    @property
    def duration_s(self) -> float | None:
        return self.meta.get("duration_s")

    def file(self, name: str) -> Path:
        """The run's file ``name``, or its compressed copy (``name.xz``, ``name.gz``) where only that is there: the
        large raw tables are committed compressed (``scripts/compress_runs.sh``), since every GPU call carries the
        tracked tree within 64 MiB; pandas unpacks them by their suffix."""
        path = self.dir / name
        if path.is_file():
            return path
        return next((p for p in (self.dir / f"{name}.xz", self.dir / f"{name}.gz") if p.is_file()), path)

    def has(self, name: str) -> bool:
        return self.file(name).is_file()

    def table(self, name: str, **read_csv) -> pd.DataFrame:
        """``<name>.csv`` (or its compressed copy) of this run; an empty frame where the run wrote none."""
        path = self.file(f"{name}.csv")
        return pd.read_csv(path, **read_csv) if path.is_file() else pd.DataFrame()

    def json(self, name: str):
        """``<name>.json`` of this run, or None."""
        path = self.dir / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None


def read_run(folder: Path) -> Run | None:
    """The run in ``folder``, or None when it has no ``run.json``, never finished (``complete`` unset) or measured
    nothing (``measured_nothing``)."""
    side = Path(folder) / "run.json"
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError):
        return None
    return Run(Path(folder), meta) if meta.get("complete") and not measured_nothing(folder) else None


def measured_nothing(folder: Path) -> str:
    """Why the run in ``folder`` holds no measurement ("" where it holds one): it has tables with a ``status``
    column (points, steps, timed runs) and not one of their rows is ``ok``. On 2026-12-04 Study 1's servers did not
    start on the H200, and its run, marked complete, held an error row per point: read as a repeat, it would have
    stood for that part and repeat on the page and in the plan. Left out, the plan lists its job again."""
    tables = []
    for path in sorted(Path(folder).glob("*.csv")):
        try:
            status = pd.read_csv(path, usecols=lambda c: c == "status")
        except (OSError, ValueError):  # unreadable or empty: not a table of outcomes
            continue
        if "status" in status and len(status):
            tables.append((path.name, status["status"].astype(str)))
    if not tables or any(col.eq("ok").any() for _, col in tables):
        return ""
    return f"no row of {', '.join(name for name, _ in tables)} is ok (the first says {tables[0][1].iloc[0]!r})"


def all_runs(study_dir: Path) -> list[Run]:
    """Every complete run under ``<study_dir>/runs/``, in (fingerprint, part, repeat) order."""
    found = (read_run(p.parent) for p in sorted(Path(study_dir).glob(f"{RUNS}/*/*/r*/run.json")))
    return sorted((r for r in found if r is not None), key=lambda r: (r.fingerprint, r.part, r.repeat))


@dataclass(frozen=True)
class RunSet:
    """The runs of one study that share one fingerprint (possibly none), and how they stand against today."""

    study: str
    runs: tuple[Run, ...] = ()
    today: Fingerprint | None = None  # the measuring path's fingerprint now; None where it has no measuring module
    # the results root the runs were found under (data/results), where other studies' runs are read beside them
    results_root: Path | None = None
    older: tuple[Run, ...] = field(default=(), repr=False)  # runs of other fingerprints (their durations plan jobs)

    @property
    def measured(self) -> bool:
        return bool(self.runs)

    @property
    def fingerprint(self) -> str:
        return self.runs[0].fingerprint if self.runs else ""

    @property
    def current(self) -> bool:
        """The data was measured by today's measuring code."""
        return self.measured and self.today is not None and self.fingerprint == self.today.digest

    @cached_property
    def changed(self) -> list[str]:
        """The measuring files that differ between the data's runs and today (empty when current)."""
        if not self.measured or self.today is None or self.current:
            return []
        recorded: dict[str, str] = {}
        for r in self.runs:
            recorded.update(r.meta.get("fingerprint_files") or {})
        if recorded:
            return self.today.changed_since(recorded)
        return git_changed(self.runs[0].commit, sorted(self.today.files))

    @property
    def repeats(self) -> list[int]:
        return sorted({r.repeat for r in self.runs})

    @property
    def parts(self) -> list[str]:
        return sorted({r.part for r in self.runs})

    def repeat(self, index: int) -> RunSet:
        """The runs (parts) of one repeat."""
        return replace(self, runs=tuple(r for r in self.runs if r.repeat == index))

    def per_repeat(self) -> list[RunSet]:
        return [self.repeat(i) for i in self.repeats]

    def repeat_name(self, index: int) -> str:
        """How a page names the repeat whose data id (its runs' ``repeat_index``) is ``index``: by its place among
        these repeats, as the findings' labels do ("repeat 1 of 3" for ``r0``)."""
        return repeat_name(self.repeats.index(int(index)), len(self.repeats))

    def repeats_name(self, indices: Iterable[int]) -> str:
        """Several repeats by their data ids, as ``repeat_name`` names one: "repeats 1 and 2 of 3"."""
        return repeats_name([self.repeats.index(int(i)) for i in indices], len(self.repeats))

    def part(self, name: str) -> RunSet:
        return replace(self, runs=tuple(r for r in self.runs if r.part == name))

    def table(self, name: str, **read_csv) -> pd.DataFrame:
        """``<name>.csv`` of every run, concatenated, with ``repeat`` and ``part`` columns in front (where a table
        has no such column already); an empty frame where no run wrote one."""
        frames = []
        for r in self.runs:
            df = r.table(name, **read_csv)
            if df.empty and not len(df.columns):
                continue
            for col, val in (("part", r.part), ("repeat", r.repeat)):
                if col not in df.columns:
                    df.insert(0, col, val)
            frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def first(self, name: str, **read_csv) -> pd.DataFrame:
        """``<name>.csv`` of the first run that has it (a table every repeat measures alike, e.g. model sizes)."""
        for r in self.runs:
            if r.has(f"{name}.csv"):
                return r.table(name, **read_csv)
        return pd.DataFrame()

    @property
    def meta(self) -> dict:
        """The first run's ``run.json`` ({} when nothing was measured)."""
        return self.runs[0].meta if self.runs else {}

    @property
    def device(self) -> dict:
        return self.meta.get("device") or {}

    @property
    def device_folder(self) -> Path | None:
        """``<results>/<device>/``, the folder the runs lie under (``<device>/<study>/runs/<fp>/<part>/r<k>``)."""
        parents = self.runs[0].dir.parents if self.runs else ()
        return parents[4] if len(parents) > 4 else None

    @property
    def device_name(self) -> str:
        # the device folder's slug where the runs recorded no name (it read "results", the root's folder, before)
        folder = self.device_folder.name if self.device_folder else ""
        return str(self.device.get("name") or folder or "this device")

    @property
    def ceilings(self) -> dict:
        return self.meta.get("ceilings") or {}

    @property
    def ceiling_record(self):
        """The first run's measured ceilings as ``measure.Ceilings`` (None where it recorded none)."""
        from servelab.measure.ceilings import Ceilings

        return Ceilings.from_dict(self.ceilings) if self.ceilings else None

    @property
    def params(self) -> dict:
        return self.meta.get("params") or {}

    def has_parts(self, parts: Iterable[str]) -> bool:
        """Every one of ``parts`` was measured in these runs (a run of part "all" measured every part)."""
        have = set(self.parts)
        return ALL_PARTS in have or set(parts) <= have

    def at(self, fingerprint: str) -> RunSet:
        """The runs of one fingerprint, among these and the older ones (e.g. ``"legacy"``: the first H200 run)."""
        every = self.runs + self.older
        keep = tuple(sorted((r for r in every if r.fingerprint == fingerprint), key=lambda r: (r.repeat, r.part)))
        return replace(self, runs=keep, older=tuple(r for r in every if r.fingerprint != fingerprint))

    def complete(self, parts: Iterable[str]) -> RunSet:
        """The repeats of these runs that measured every one of ``parts``. Where none did (a study still measured
        part by part), the complete repeats of the most recently written older fingerprint that has one (then
        ``current`` is False and ``changed`` says why); an empty set where no fingerprint has a complete repeat.
        A reader that needs a whole study (the simulator's replay of Study 1) takes this, not a half-measured one."""
        parts = tuple(parts)

        def whole(rs: RunSet) -> RunSet:
            return replace(rs, runs=tuple(r for r in rs.runs if rs.repeat(r.repeat).has_parts(parts)))

        got = whole(self)
        if got.measured:
            return got
        by_fp: dict[str, list[Run]] = {}
        for r in self.older:
            by_fp.setdefault(r.fingerprint, []).append(r)
        latest = sorted(by_fp.values(), key=lambda rs: max(str(r.meta.get("written_utc", "")) for r in rs))
        for rs in reversed(latest):
            ordered = tuple(sorted(rs, key=lambda r: (r.repeat, r.part)))
            rest = tuple(r for r in self.runs + self.older if r.fingerprint != ordered[0].fingerprint)
            got = whole(replace(self, runs=ordered, older=rest))
            if got.measured:
                return got
        return replace(self, runs=())

    def combined(
        self,
        findings: Callable[[RunSet], Sequence[Finding]],
        min_repeats: int = MIN_REPEATS,
        needs: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Finding]:
        """Each repeat's findings (``findings(one_repeat)``, the study's verdict rules applied to that repeat's data)
        combined over the repeats by ``combine``; [] when nothing was measured.

        ``needs`` maps a claim to the parts its rule reads. A repeat whose runs lack one of them does not judge that
        claim (a rule run on absent data would read its absence as a result), so the claim rests on fewer repeats;
        a claim no repeat could judge reads **inconclusive**, not measured, naming the parts it waits for."""
        needs = needs or {}
        order: list[str] = []
        per_repeat = []
        for rep in self.per_repeat():
            fs = list(findings(rep))
            order += [f.id for f in fs if f.id not in order]
            per_repeat.append([f for f in fs if rep.has_parts(needs.get(f.id, ()))])
        got = {f.id: f for f in combine(per_repeat, min_repeats=min_repeats)}
        if len(got) < len(order):
            for f in not_measured(self.study):
                if f.id in order and f.id not in got:
                    waits = [p for p in needs.get(f.id, ()) if p not in self.parts]
                    if len(waits) > 1:
                        why = f"its parts {', '.join(waits)} have no run at this fingerprint yet"
                    elif waits:
                        why = f"its part {waits[0]} has no run at this fingerprint yet"
                    else:  # every part ran, but in different repeats
                        why = "no repeat at this fingerprint has all of its parts yet"
                    got[f.id] = replace(
                        f,
                        note=f"Not measured: {why} (make gpu-plan lists the jobs)",
                        repeats=0,
                        repeat_verdicts=";".join(MISSING for _ in per_repeat),
                    )
        return [got[i] for i in order if i in got]


def pool_repeats(df: pd.DataFrame, keys: Sequence[str], drop: Sequence[str] = ("repeat", "part")) -> pd.DataFrame:
    """One row per ``keys`` from a table of several repeats: each numeric column's median over the repeats (the
    figures' and tables' value), other columns from the first repeat, and ``n_repeats`` (how many had that row)."""
    if df.empty or "repeat" not in df:
        return df
    keys = [k for k in keys if k in df.columns]
    df = _over_the_repeats_that_ran(df, keys)
    d = df.drop(columns=[c for c in drop if c in df.columns and c not in keys])
    keys = [k for k in keys if k in d.columns]
    num = [c for c in d.columns if c not in keys and pd.api.types.is_numeric_dtype(d[c])]
    other = [c for c in d.columns if c not in keys and c not in num]
    g = d.groupby(keys, sort=False, dropna=False)
    out = g[num].median() if num else g.size().to_frame("_").drop(columns="_")
    if other:
        out = out.join(g[other].first())
    out["n_repeats"] = df.groupby(keys, sort=False, dropna=False)["repeat"].nunique()
    return out.reset_index()[[*keys, *[c for c in d.columns if c not in keys], "n_repeats"]]


def _over_the_repeats_that_ran(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Where a table records each row's outcome (``status``), a point that some repeats ran ("ok") is pooled over
    those alone: Study 7's repeat 0 skipped its burst runs (time budget), and pooling every repeat gave the point
    that repeat's status, "skipped", beside the medians of the two that ran, with n_repeats 3. A point no repeat
    ran keeps every row, and the first one's status. The points keep their order of first appearance."""
    if "status" not in df or not keys:
        return df
    ok = df["status"].astype(str).eq("ok")
    ran = ok.groupby([df[k] for k in keys], sort=False, dropna=False).transform("any")
    if ok.eq(ran).all():  # nothing to drop: every row ran, or its whole point did not
        return df
    order = df[keys].drop_duplicates()
    kept = df[ok | ~ran]
    return order.merge(kept, on=list(keys), how="left")


def _merge(present: Sequence[Finding], said: Sequence[str]) -> Finding:
    """One finding from the repeats that judged a claim, for its number and text (``combine`` sets the verdict).

    A repeat too thin for its rule has no headline, so the others' do not combine with it: the number is then the
    median over the repeats that have one, and ``repeats`` counts those (F6.2 read "not measured" where 2 of 3
    repeats had measured ρ = -1.00 and the third ran one pair short). Where even those do not combine, the last
    repeat's text stands, with no spread."""
    if len(present) == 1:  # one repeat has no spread to show: it is its own finding
        return present[0]
    try:
        return combine_repeats(present, min_repeats=1)
    except ValueError:
        pass
    numbered = [f for f in present if f.headline is not None]
    if numbered and len(numbered) < len(present):
        try:
            merged = numbered[0] if len(numbered) == 1 else combine_repeats(numbered, min_repeats=1)
        except ValueError:
            pass
        else:  # the text's repeat counted among all that judged the claim, not among the numbered ones
            chosen = numbered[merged.text_repeat or 0]
            return replace(merged, text_repeat=next(i for i, f in enumerate(present) if f is chosen))
    last = len(present) - 1
    return replace(present[last], repeats=len(present), repeat_verdicts=";".join(said), spread="", text_repeat=last)


def _name_text_repeat(merged: Finding, slots: Sequence[Finding | None]) -> Finding:
    """Say which repeat the text comes from, where the repeats' texts differ: a note quotes one repeat's numbers
    (the one nearest the median), while the tables beside it give medians over all, and a reader saw F7.1's note
    read 3.74× where its table read 3.79×. ``slots``: each repeat's finding in run order, None where it has none."""
    if merged.text_repeat is None:
        return merged
    present = [(k, f) for k, f in enumerate(slots) if f is not None]
    k, chosen = present[merged.text_repeat]
    which = repeat_name(k, len(slots))
    note, measured = merged.note, merged.measured_value
    if len({f.note for _, f in present}) > 1:
        how = ", the one nearest the median" if merged.headline is not None else ""
        note = f"[from {which}{how}] {note}"
    if measured == chosen.measured_value and len({f.measured_value for _, f in present}) > 1:
        measured = repeat_label(k, len(slots)) + measured
    return replace(merged, note=note, measured_value=measured)


# a sentence's end: a period after anything but a digit (so "0.85 for" and "1.5B" do not end one), then a space
_SENTENCE_END = re.compile(r"(?<=[^\d\s])\.\s")


def _thin_reason(slots: Sequence[Finding | None], thin: Sequence[int], note: str) -> str:
    """ " In repeat k of n, <why its rule found too little>.": the first sentence of the one thin repeat's own note
    (``thin``: the places of the repeats too thin for their rule), where the note shown is another repeat's. F6.2's
    page read "repeat 3 of 3 had too little data for its rule" and no more, while that repeat's note said its budget
    had left two pairs one prompt short. "" otherwise."""
    if len(thin) != 1 or slots[thin[0]] is None:
        return ""
    own = slots[thin[0]].note.strip()
    if not own or own in note:
        return ""
    first = _SENTENCE_END.split(own, maxsplit=1)[0].rstrip(".;, ")
    lead = "" if note.rstrip().endswith(".") else "."  # after a bracket too: the landing page drops brackets
    return f"{lead} In {repeat_name(thin[0], len(slots))}, {first}."


def combine(per_repeat: Sequence[Sequence[Finding]], *, min_repeats: int = MIN_REPEATS) -> list[Finding]:
    """One finding per claim from each repeat's findings (claims in first-seen order).

    A claim is **inconclusive** where its repeats disagree (``repeats.combine_repeats``), where any repeat judged it
    inconclusive, or where fewer than ``min_repeats`` repeats judged it: the note then says how many there are, and
    ``repeat_verdicts`` keeps what each said (``missing`` for a repeat without that claim).
    """
    order: list[str] = []
    by_id: dict[str, list[Finding | None]] = {}
    for i, fs in enumerate(per_repeat):
        for f in fs:
            if f.id not in by_id:
                order.append(f.id)
                by_id[f.id] = [None] * len(per_repeat)
            by_id[f.id][i] = f
    out = []
    for fid in order:
        present = [f for f in by_id[fid] if f is not None]
        said = [f.verdict if f is not None else MISSING for f in by_id[fid]]
        merged = _name_text_repeat(_merge(present, said), by_id[fid])
        verdict, why = merged.verdict, ""
        thin = [i for i, v in enumerate(said) if v == INCONCLUSIVE]
        if thin:
            verdict = INCONCLUSIVE
            why = repeats_name(thin, len(said)) + (
                ": its data was too thin for its rule"
                if len(thin) == 1
                else ": their data were too thin for their rule"
            )
            if merged.repeats < len(present):
                n = merged.repeats
                why += f"; the value is over the {n} repeat{'s' if n != 1 else ''} that measured it"
        if len(present) < min_repeats:
            verdict = INCONCLUSIVE
            why = f"rests on {len(present)} repeat{'s' if len(present) != 1 else ''}; a verdict needs {min_repeats}"
        note = merged.note + _thin_reason(by_id[fid], thin, merged.note) + (f" [{why}]" if why else "")
        out.append(replace(merged, verdict=verdict, note=note, repeat_verdicts=";".join(said)))
    return out


def git_changed(commit: str, files: list[str]) -> list[str]:
    """Of ``files`` (paths in the repository), those git says differ between ``commit`` and the working tree: how a
    run from before fingerprints (no ``fingerprint_files``) names what changed. All of them where git cannot tell."""
    import subprocess

    from servelab.paths import REPO_ROOT

    base = commit.removesuffix("+dirty")
    try:
        out = subprocess.run(
            ["git", "diff", "--name-only", base, "--", *files],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return files
    if out.returncode != 0:
        return files
    known = subprocess.run(["git", "ls-tree", "-r", "--name-only", base, "--", *files], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=60).stdout.split()  # fmt: skip
    return sorted(set(out.stdout.split()) | (set(files) - set(known)))


def _device_dirs(root: Path, study: str, device: str | None) -> list[Path]:
    dirs = sorted(p.parent for p in Path(root).glob(f"*/{study}") if p.is_dir())
    if device is not None:
        return [d for d in dirs if device in d.name]
    book = [d for d in dirs if BOOK_DEVICE in d.name]
    return book or dirs


def study_runs(
    study: str, root: Path | None = None, device: str | None = None, *, measuring: str | None = None
) -> RunSet:
    """The runs the page of ``study`` shows: today's fingerprint's complete runs where any exist, else the most
    recently measured fingerprint's (then ``current`` is False and ``changed`` names the files).

    ``device``: a substring of the device folder's slug; None: the book's device (``h200``) where it has data, else
    any device (a CPU smoke run in a scratch results root). ``measuring``: the measuring module (by default the
    studies' convention, ``measuring_module``)."""
    root = Path(root or results_root())
    module = measuring or measuring_module(study)
    try:
        today = fingerprint(module)
    except ModuleNotFoundError:
        today = None
    candidates = []
    for ddir in _device_dirs(root, study, device):
        candidates += [(ddir.parent, r) for r in all_runs(ddir / study)]
    if not candidates:
        dirs = _device_dirs(root, study, device)
        return RunSet(study, (), today, dirs[0].parent if dirs else None)
    runs = [r for _, r in candidates]
    fps = {r.fingerprint for r in runs}
    chosen = today.digest if today is not None and today.digest in fps else None
    if chosen is None:
        latest = max(runs, key=lambda r: str(r.meta.get("written_utc", "")))
        chosen = latest.fingerprint
    keep = tuple(sorted((r for r in runs if r.fingerprint == chosen), key=lambda r: (r.repeat, r.part)))
    ddir = next(d for d, r in candidates if r is keep[0])
    older = tuple(r for r in runs if r.fingerprint != chosen)
    return RunSet(study, keep, today, ddir, older)
