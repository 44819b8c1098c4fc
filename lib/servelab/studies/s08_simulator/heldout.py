"""A held-out set that stays held out: fresh runs drawn after the freeze, each evaluated exactly once.

The protocol (issue 23, item 4):

1. ``freeze.py`` records the cost model (code hashes, inputs, fitted coefficients, error on the used runs);
2. ``register(run_id)`` records the spec ``data/validation/<run_id>.yaml`` (papermill parameters of notebook 01:
   a seed and rate fractions no used run had) in the ledger, after the freeze and before the run;
3. the run: notebook 01 with ``-f data/validation/<run_id>.yaml`` and ``SERVELAB_RESULTS`` pointing at
   ``data/validation/runs/<run_id>``, so that it never overwrites the book's Study 1;
4. ``report_once(run_id)`` replays its runs on the frozen models (no refit) and records the error in the ledger.
   It refuses when the cost-model code differs from the freeze (the model changed: freeze again, draw a new run),
   when the run was already used (by id, or its data under another name), when the run does not match its spec,
   or when it started before its registration. An improvement after that is measured on another fresh run.

The campaign runs a fresh run as the simulator's ``fresh_*`` parts, one seed per repeat (``register --repeats``);
``report_campaign`` evaluates each repeat once as step 4 does and records one ``reported`` row per seed.

Command line: ``python -m servelab.studies.s08_simulator.heldout {register,report,status} [RUN_ID]`` (``report``
takes the campaign's parts where ``runs/<run_id>/`` does not exist).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import lzma
import statistics
from pathlib import Path

import pandas as pd
import yaml

from servelab.errors import ParameterError
from servelab.loadgen.metrics import summarize
from servelab.measure.results import git_commit
from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import repeat_name
from servelab.studies.common.page import md_cell
from servelab.studies.s08_simulator import freeze_record, ledger, sources, study1_runs, validation

CHECKED_KEYS = ("seed", "rate_fractions")  # what makes a run fresh, compared between the spec and the run


def spec_path(run_id: str, root: Path = freeze_record.VALIDATION_DIR) -> Path:
    return Path(root) / f"{run_id}.yaml"


def run_root(run_id: str, root: Path = freeze_record.VALIDATION_DIR) -> Path:
    """The results root the fresh run writes to (``SERVELAB_RESULTS``): ``<root>/runs/<run_id>``."""
    return Path(root) / "runs" / run_id


def load_spec(run_id: str, root: Path = freeze_record.VALIDATION_DIR) -> dict:
    """The papermill parameters of a fresh run; it must set an integer seed and a list of rate fractions."""
    path = spec_path(run_id, root)
    if not path.is_file():
        raise ParameterError(f"no spec for fresh run {run_id!r} at {path}")
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict):
        raise ParameterError(f"{path}: a fresh run's spec is a mapping of notebook 01's parameters")
    seed, fr = spec.get("seed"), spec.get("rate_fractions")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ParameterError(f"{path}: seed must be an integer, got {seed!r}")
    if not isinstance(fr, list) or not fr or not all(isinstance(x, (int, float)) and x > 0 for x in fr):
        raise ParameterError(f"{path}: rate_fractions must be a non-empty list of positive numbers, got {fr!r}")
    return spec


def _floats(cell: str) -> set[float]:
    return {float(x) for x in str(cell).split(";") if x.strip()}


def _check_fresh(spec: dict, book: pd.DataFrame, run_id: str, repeats: int = 1) -> None:
    """Seeds no used run had (the spec's and the ``repeats`` - 1 after it), and rate fractions none of them had
    (calibration or held-out)."""
    used = book[book["event"].isin(ledger.USED)]
    seeds = {int(s) for s in used["seed"] if str(s).strip()}
    fractions = set().union(*map(_floats, used["rate_fractions"])) if len(used) else set()
    again = sorted(seeds & {spec["seed"] + k for k in range(repeats)})
    if again:
        said = f"seed {again[0]} was" if len(again) == 1 else f"seeds {', '.join(map(str, again))} were"
        raise ParameterError(f"fresh run {run_id!r}: {said} used before (used seeds {sorted(seeds)})")
    reused = sorted(fractions & {float(x) for x in spec["rate_fractions"]})
    if reused:
        raise ParameterError(f"fresh run {run_id!r}: rate fractions {reused} were used before ({sorted(fractions)})")


def _current_freeze(root: Path, repo: Path) -> dict:
    """The freeze, refused where the cost-model code here differs from it."""
    rec = freeze_record.load_freeze(root)
    changed = freeze_record.changed_files(rec, repo)
    if changed:
        raise ParameterError(
            f"the cost-model code changed since the freeze of {rec['frozen_utc']} ({', '.join(changed)}): its error "
            "on a fresh run would not describe this code. Freeze again (python -m servelab.studies.s08_simulator."
            "freeze --replace) and draw a new fresh run."
        )
    return rec


def register(
    run_id: str, *, root: Path = freeze_record.VALIDATION_DIR, repo: Path = REPO_ROOT, repeats: int = 1
) -> list[dict]:
    """Record the fresh run's spec in the ledger, after the freeze and before the run: one row per seed its
    ``repeats`` repeats will run with (the campaign's repeat k runs the spec's seed + k); the ledger rows."""
    root = Path(root)
    rec = _current_freeze(root, repo)
    spec = load_spec(run_id, root)
    book = ledger.read(root / freeze_record.LEDGER_FILE)
    if len(ledger.used(book, run_id=run_id)):
        raise ParameterError(f"fresh run {run_id!r} was already used: draw another (a new spec, a new seed)")
    if repeats < 1:
        raise ParameterError(f"repeats must be >= 1, got {repeats}")
    _check_fresh(spec, book, run_id, repeats)
    rows = []
    for k in range(repeats):
        row = {
            "run_id": run_id,
            "event": "registered",
            "utc": freeze_record.utc_now(),
            "commit": git_commit(),
            "freeze_sha256": ledger.file_sha256(root / freeze_record.FREEZE_FILE),
            "code_sha256": rec["code"]["sha256"],
            "seed": spec["seed"] + k,
            "rate_fractions": [float(x) for x in spec["rate_fractions"]],
            "note": f"spec sha256 {ledger.file_sha256(spec_path(run_id, root))}"
            + (f"; the campaign's {repeat_name(k, repeats)}, data id r{k} (spec seed + {k})" if repeats > 1 else ""),
        }
        ledger.append(root / freeze_record.LEDGER_FILE, row)
        rows.append(row)
    return rows


def _utc(s: str) -> _dt.datetime:
    try:
        return _dt.datetime.fromisoformat(str(s))
    except ValueError:
        raise ParameterError(f"not an ISO time: {s!r}") from None


def _registration(book: pd.DataFrame, run_id: str, rec: dict, root: Path) -> pd.Series:
    """The run's latest registration, checked: under the current freeze, with the spec unchanged since."""
    reg = book[(book["run_id"] == run_id) & (book["event"] == "registered")]
    if not len(reg):
        raise ParameterError(f"fresh run {run_id!r} was never registered (heldout register {run_id}, before the run)")
    last = reg.iloc[-1]
    if last["freeze_sha256"] != ledger.file_sha256(root / freeze_record.FREEZE_FILE):
        raise ParameterError(
            f"fresh run {run_id!r} was registered under an earlier freeze, not the one of {rec['frozen_utc']}: "
            "draw a new fresh run"
        )
    spec_file = spec_path(run_id, root)
    if last["note"] != f"spec sha256 {ledger.file_sha256(spec_file)}":
        raise ParameterError(f"{spec_file} changed after its registration: draw a new fresh run")
    return last


def _load_run(run_id: str, root: Path, spec: dict, registered_utc: str):
    """The fresh run's Study 1 records and parameters, checked against its spec and its registration time."""
    found = study1_runs.load_study1(run_root(run_id, root))
    if found is None:
        raise ParameterError(f"no Study 1 run under {run_root(run_id, root)} (<slug>/01_scheduling/requests.csv)")
    requests, _, params, slug = found
    s1_dir = run_root(run_id, root) / slug / study1_runs.STUDY1
    run = json.loads((s1_dir / "run.json").read_text())
    if _utc(run.get("started_utc", "1970-01-01T00:00:00+00:00")) < _utc(registered_utc):
        raise ParameterError(f"fresh run {run_id!r} started ({run.get('started_utc')}) before its registration")
    for k in CHECKED_KEYS:
        if params.get(k) != spec[k] and not (k == "rate_fractions" and _same_floats(params.get(k), spec[k])):
            raise ParameterError(f"fresh run {run_id!r}: its {k} is {params.get(k)!r}, its spec says {spec[k]!r}")
    return requests, params, run, s1_dir / "requests.csv"


def _same_floats(a, b) -> bool:
    return isinstance(a, list) and sorted(map(float, a)) == sorted(map(float, b))


def evaluate(requests: pd.DataFrame, params: dict, models: dict) -> pd.DataFrame:
    """Every run of a Study 1 result replayed on the frozen ``models`` (no fitting): one row per run × metric
    (``validation.compare``'s ``metric, real, sim, error_pct`` after the run's keys)."""
    kw = study1_runs.sim_kwargs_for(study1_runs.server_limits(params))
    outputs_for = study1_runs.requested_outputs_for(params)
    deadline = params["window_s"] + params["drain_s"] if {"window_s", "drain_s"} <= set(params) else None
    rows = []
    for key, rec, _ in validation.run_groups(requests):
        cost = models.get(key["model"])
        if cost is None:
            raise ParameterError(f"no frozen cost model for {key['model']} (frozen: {sorted(models)})")
        sim = validation.replay(key, rec, cost, kw, outputs_for, deadline)
        rows += [{**key, **row} for row in validation.compare(summarize(rec), summarize(sim))]
    return pd.DataFrame(rows)


def report_once(run_id: str, *, root: Path = freeze_record.VALIDATION_DIR, repo: Path = REPO_ROOT) -> dict:
    """Evaluate the frozen model on fresh run ``run_id`` once (see the module's docstring for what is refused).

    Writes ``runs/<run_id>/heldout_report.csv`` (run × metric) and the ledger's ``reported`` row; returns that row
    with ``median_abs_error_pct`` (median |error| over every run and metric, %) as a float."""
    root = Path(root)
    rec = _current_freeze(root, repo)
    book = ledger.read(root / freeze_record.LEDGER_FILE)
    if len(ledger.used(book, run_id=run_id)):
        raise ParameterError(f"fresh run {run_id!r} was already used for a report: measure on another fresh run")
    spec = load_spec(run_id, root)
    reg = _registration(book, run_id, rec, root)
    requests, params, run, requests_csv = _load_run(run_id, root, spec, reg["utc"])
    sha = ledger.file_sha256(requests_csv)
    if len(ledger.used(book, data_sha256=sha)):
        raise ParameterError(f"the data of {run_id!r} was already used (as {ledger.used(book, data_sha256=sha)})")
    table = evaluate(requests, params, freeze_record.frozen_models(rec, root))
    err = float(table["error_pct"].abs().median())
    table.to_csv(run_root(run_id, root) / "heldout_report.csv", index=False)
    drift = run.get("git_commit", "") != rec["calibration"]["study1_commit"]
    row = {
        "run_id": run_id,
        "event": "reported",
        "utc": freeze_record.utc_now(),
        "commit": git_commit(),
        "freeze_sha256": reg["freeze_sha256"],
        "code_sha256": rec["code"]["sha256"],
        "data_sha256": sha,
        "seed": params["seed"],
        "rate_fractions": [float(x) for x in params["rate_fractions"]],
        "runs": len(table.drop_duplicates(subset=validation.RUN_KEYS)),
        "median_abs_error_pct": err,
        "note": f"run at {run.get('git_commit', '')[:12]}"
        + (f"; the calibration runs at {rec['calibration']['study1_commit'][:12]}" if drift else ""),
    }
    ledger.append(root / freeze_record.LEDGER_FILE, row)
    return row


# ---- the campaign's fresh runs (the simulator's ``fresh_*`` parts) ----------------------------------------------
FRESH = "fresh_"


def _content_sha256(path: Path) -> str:
    """SHA-256 of a table's content: the plain file's bytes, or what its ``.xz`` copy unpacks to. A fresh run's
    request records are committed in xz (scripts/compress_runs.sh) but were hashed plain when first reported, and a
    used-data check must see the same data under either form."""
    if path.suffix != ".xz":
        return ledger.file_sha256(path)
    h = hashlib.sha256()
    with lzma.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def campaign_repeats(runs) -> list[dict]:
    """The fresh runs the simulator's measuring path wrote (``runs``: its ``RunSet``), one per repeat: the spec and
    seed it ran with, its own freeze check, when it started, its request records (every ``fresh_*`` part of that
    repeat) and their hash, and its Study 1 parameters."""
    out = []
    for rep in runs.per_repeat() if runs.measured else []:
        fresh = [r for r in rep.runs if r.part.startswith(FRESH)]
        frames, shas = [], []
        for r in fresh:
            if not r.has("fresh_requests.csv"):
                continue
            req = r.table("fresh_requests", keep_default_na=False, na_values=[""])
            if "error" in req.columns:
                req["error"] = req["error"].fillna("")
            frames.append(req)
            shas.append(_content_sha256(r.file("fresh_requests.csv")))
        if not frames:
            continue
        seed = fresh[0].json("fresh_seed") or {}
        out.append(
            {
                "repeat": rep.repeats[0],
                "parts": [r.part for r in fresh],
                "fresh_run": seed.get("fresh_run"),
                "seed": seed.get("seed"),
                "checks": [r.json("freeze_check") or {} for r in fresh],
                "started_utc": min(str(r.meta.get("started_utc", "")) for r in fresh),
                "requests": pd.concat(frames, ignore_index=True),
                "params": fresh[0].json("fresh_params") or {},
                "data_sha256": shas[0] if len(shas) == 1 else hashlib.sha256("".join(shas).encode()).hexdigest(),
                "commit": str(fresh[0].meta.get("git_commit", "")),
            }
        )
    return out


def _check_repeat(run_id: str, c: dict, at: pd.DataFrame, rec: dict, spec: dict, book: pd.DataFrame) -> None:
    """One campaign repeat of a fresh run, refused unless fresh: its seed's registration (``at``) came before it,
    it ran the frozen code and its spec's rate fractions, and its data was never used."""
    what = f"{run_id!r}'s repeat with data id r{c['repeat']} (seed {c['seed']})"
    if not len(at):
        raise ParameterError(f"{what} was not registered")
    if _utc(c["started_utc"] or "1970-01-01T00:00:00+00:00") < _utc(at["utc"].iat[0]):
        raise ParameterError(f"{what} started before its registration")
    if not all(ch.get("code_sha256") == rec["code"]["sha256"] for ch in c["checks"]):
        raise ParameterError(f"{what} ran cost-model code other than the frozen code")
    if not _same_floats(c["params"].get("rate_fractions"), spec["rate_fractions"]):
        raise ParameterError(f"{what}: its rate fractions are not its spec's")
    if len(ledger.used(book, data_sha256=c["data_sha256"])):
        raise ParameterError(f"the data of {what} was already used")


def report_campaign(
    run_id: str, runs=None, *, root: Path = freeze_record.VALIDATION_DIR, repo: Path = REPO_ROOT
) -> list[dict]:
    """Evaluate each repeat of fresh run ``run_id`` that the campaign measured (``runs``: the simulator's
    ``RunSet``, by default the book's) once on the frozen models, and record it: one ``reported`` row per seed not
    reported before; the rows written. Refused as ``report_once`` refuses, per repeat: code that differs from the
    freeze (here, or in the run's own freeze check), a seed not registered for ``run_id`` under this freeze, a run
    that started before its registration, a seed or data already used."""
    from servelab.studies.common.runs import study_runs

    root = Path(root)
    rec = _current_freeze(root, repo)
    book = ledger.read(root / freeze_record.LEDGER_FILE)
    freeze_sha = ledger.file_sha256(root / freeze_record.FREEZE_FILE)
    reg = book[(book["run_id"] == run_id) & (book["event"] == "registered") & (book["freeze_sha256"] == freeze_sha)]
    if not len(reg):
        raise ParameterError(f"fresh run {run_id!r} is not registered under the freeze of {rec['frozen_utc']}")
    spec = load_spec(run_id, root)
    if not (reg["note"].str.startswith(f"spec sha256 {ledger.file_sha256(spec_path(run_id, root))}")).all():
        raise ParameterError(f"{spec_path(run_id, root)} changed after its registration: draw a new fresh run")
    runs = runs if runs is not None else study_runs("08_simulator")
    mine = [c for c in campaign_repeats(runs) if c["fresh_run"] == run_id]
    if not mine:
        raise ParameterError(f"no fresh part of the simulator's runs ran {run_id!r}")
    used = book[book["event"].isin(ledger.USED)]
    models = freeze_record.frozen_models(rec, root)
    rows = []
    for c in mine:
        seed = int(c["seed"])
        if len(used[(used["run_id"] == run_id) & (used["seed"] == str(seed))]):
            continue  # evaluated once already: the ledger holds its number
        _check_repeat(run_id, c, reg[reg["seed"] == str(seed)], rec, spec, book)
        req = c["requests"][c["requests"]["model"].isin(models)]
        table = evaluate(req, c["params"], models)
        row = {
            "run_id": run_id,
            "event": "reported",
            "utc": freeze_record.utc_now(),
            "commit": git_commit(),
            "freeze_sha256": freeze_sha,
            "code_sha256": rec["code"]["sha256"],
            "data_sha256": c["data_sha256"],
            "seed": seed,
            "rate_fractions": [float(x) for x in spec["rate_fractions"]],
            "runs": len(table.drop_duplicates(subset=validation.RUN_KEYS)),
            "median_abs_error_pct": float(table["error_pct"].abs().median()),
            "note": f"the campaign's repeat with data id r{c['repeat']} ({', '.join(c['parts'])}), run at "
            f"{c['commit'][:12]}",
        }
        ledger.append(root / freeze_record.LEDGER_FILE, row)
        rows.append(row)
    return rows


def status(book: pd.DataFrame, freeze_sha256: str | None = None) -> pd.DataFrame:
    """``ledger.status``, with a campaign's fresh run (one ``reported`` row per repeat's seed) as one row: its seeds'
    range, its runs summed, the median of its repeats' errors and each repeat's in the note."""
    st = ledger.status(book, freeze_sha256)
    for i, run_id in enumerate(st["run_id"] if len(st) else []):
        each = book[(book["run_id"] == run_id) & (book["event"] == "reported")]
        if len(each) < 2:
            continue
        seeds = sorted(int(x) for x in each["seed"])
        errs = [float(x) for x in each["median_abs_error_pct"]]
        st.loc[st.index[i], ["status", "seed", "runs", "median_abs_error_pct", "note"]] = [
            f"used (each of {len(each)} repeats evaluated once)",
            f"{seeds[0]}–{seeds[-1]}",
            str(sum(int(x) for x in each["runs"])),
            f"{statistics.median(errs):.4g}",
            "median of the repeats' errors: "
            + ", ".join(f"seed {sd} {e:.1f} %" for sd, e in zip(each["seed"], errs, strict=True)),
        ]
    return st


# ---- the page ------------------------------------------------------------------------------------------------
def _page_runs(book: pd.DataFrame, study1_slug: str | None) -> str:
    """What the page's own validation runs are, by the hash of the Study 1 data it replayed."""
    if study1_slug is None:
        return "The validation runs above are CPU stand-ins made by this run, not in the ledger."
    sha = sources.study1_requests_sha256(None)  # the repeat the page replays: Study 1's first
    hit = ledger.used(book, data_sha256=sha) if sha else book.iloc[0:0]
    if len(hit):
        return (
            f"The validation runs above were never fitted to, but they are ledger run `{hit['run_id'].iat[0]}`: the "
            "model was improved while its error on them was reported, so they are *used*, not held out."
        )
    return (
        f"The validation runs above (Study 1 on {study1_slug}) are not in the ledger: held out from this page's "
        "fit, but not drawn and registered after the freeze as a fresh run is."
    )


def section(root: Path = freeze_record.VALIDATION_DIR, repo: Path = REPO_ROOT, study1_slug: str | None = None) -> str:
    """Markdown for notebook 08's held-out section: the freeze, whether this code matches it, what the page's
    validation runs are (``study1_slug``: the device slug of the Study 1 runs it replayed, None for stand-ins),
    and each run of the ledger as fresh or used, with its error; every number from ``sim_freeze.json`` and
    ``ledger.csv``."""
    root = Path(root)
    book = ledger.read(root / freeze_record.LEDGER_FILE)
    head = f"**Held-out runs.** {_page_runs(book, study1_slug)} "
    try:
        rec = freeze_record.load_freeze(root)
    except ParameterError:
        return head + (
            "The cost model has not been frozen (`python -m servelab.studies.s08_simulator.freeze`): no error on "
            "this page is on a fresh run."
        )
    changed = freeze_record.changed_files(rec, repo)
    code = (
        "the code here matches it"
        if not changed
        else f"the code here differs from it ({', '.join(f'`{f}`' for f in changed)}): the fresh runs' errors "
        "below describe the frozen code, and a new freeze with a new fresh run is needed"
    )
    h = rec["used_heldout"]
    text = head + (
        f"The cost model was frozen on {rec['frozen_utc'][:10]} at `{rec['commit'][:7]}` (code hash "
        f"`{rec['code']['sha256'][:12]}`); {code}. At the freeze its median |error| on the {h['runs']} used "
        f"held-out runs was {h['median_abs_error_pct']:.1f} %. Only a fresh run, drawn after the freeze and "
        f"evaluated once, measures held-out error:\n\n"
    )
    st = status(book, ledger.file_sha256(root / freeze_record.FREEZE_FILE))  # a voided registration says so
    if not len(st):
        return text + "No run is in the ledger yet.\n"
    cols = "| Run | Status | Since | Seed | Rate fractions | Runs | Median \\|error\\| % |\n" + "|---" * 7 + "|\n"
    rows = "".join(
        f"| {md_cell(r.run_id)} | {md_cell(r.status)} | {str(r.since_utc)[:10]} | {md_cell(r.seed)} | "
        f"{md_cell(str(r.rate_fractions).replace(';', ', '))} | {md_cell(r.runs) or '—'} | "
        f"{_pct(r.median_abs_error_pct)} |\n"
        for r in st.itertuples()
    )
    return text + cols + rows


def _pct(cell) -> str:
    try:
        return f"{float(cell):.1f}"
    except ValueError:
        return "—"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.studies.s08_simulator.heldout", description=__doc__)
    ap.add_argument("action", choices=("register", "report", "status"))
    ap.add_argument("run_id", nargs="?", help="a spec's name: data/validation/<run_id>.yaml")
    ap.add_argument("--repeats", type=int, default=1, help="register: the seeds of this many repeats (seed + k)")
    ap.add_argument(
        "--root", type=Path, default=freeze_record.VALIDATION_DIR, help="where the freeze and the ledger live"
    )
    a = ap.parse_args(argv)
    if a.action != "status" and not a.run_id:
        ap.error(f"{a.action} needs a run_id")
    try:
        if a.action == "register":
            for row in register(a.run_id, root=a.root, repeats=a.repeats):
                print(row)
        elif a.action == "report" and not run_root(a.run_id, a.root).exists():  # the campaign's fresh parts
            for row in report_campaign(a.run_id, root=a.root):
                print(f"{a.run_id} seed {row['seed']}: median |error| {row['median_abs_error_pct']:.2f} % over "
                      f"{row['runs']} runs (once)")  # fmt: skip
        elif a.action == "report":
            row = report_once(a.run_id, root=a.root)
            print(f"{a.run_id}: median |error| {row['median_abs_error_pct']:.2f} % over {row['runs']} runs (once)")
        else:
            print(status(ledger.read(a.root / freeze_record.LEDGER_FILE)).to_string(index=False))
    except ParameterError as e:
        ap.exit(2, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
