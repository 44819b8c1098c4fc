"""Whether the server a fresh held-out run measured is the server the frozen cost models were fitted to.

The frozen serving terms (per-step overhead, ingress) were fitted to Study 1's runs of one commit. A fresh run
measures the server of its own commit, and the server may have changed in between (asynchronous scheduling, a
cheaper step): then a large held-out error says the simulator was frozen on another server, not that its model
of serving is wrong. The decode step is where such a change shows first, so this sets each model's real p50 ITL in
the calibration runs beside its real and simulated p50 ITL in the fresh runs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.loadgen.metrics import summarize
from servelab.paths import REPO_ROOT
from servelab.studies.s08_simulator import validation

METRIC = "p50 ITL"
# the fresh runs' real decode differs from the calibration runs' by more than this factor either way: the page says
# the server changed under the frozen model (a quarter: more than the repeats of one commit move it)
CHANGED = 1.25


def calibration_metric(rec: dict, repo: Path = REPO_ROOT, metric: str = METRIC) -> pd.Series:
    """The frozen models' calibration runs (``rec``: the freeze record; its Study 1 folders), each run's real
    ``metric``, median per model (ms)."""
    frames = []
    for folder in (rec.get("calibration") or {}).get("study1", []):
        d = Path(repo) / folder
        path = next((p for p in (d / "requests.csv", d / "requests.csv.xz") if p.is_file()), None)
        if path is not None:
            frames.append(pd.read_csv(path, keep_default_na=False, na_values=[""]))
    if not frames:
        return pd.Series(dtype=float)
    requests = pd.concat(frames, ignore_index=True)
    requests["error"] = requests["error"].fillna("") if "error" in requests else ""
    rows = []
    for key, records, _ in validation.run_groups(requests):
        real = {r["metric"]: r["real"] for r in validation.compare(summarize(records), {})}
        rows.append({"model": key["model"], "value": real.get(metric)})
    return pd.DataFrame(rows).dropna().groupby("model")["value"].median()


def drift(table: pd.DataFrame, rec: dict, repo: Path = REPO_ROOT, metric: str = METRIC) -> pd.DataFrame:
    """Per model: ``calibration`` (real, the calibration runs), ``fresh_real`` and ``fresh_sim`` (the fresh runs'
    ``table``, `heldout.evaluate`'s rows; medians over runs), ``ratio`` (fresh real over calibration) and
    ``changed`` (the ratio past ``CHANGED`` either way)."""
    rows = table[table["metric"] == metric]
    fresh = rows.groupby("model").agg(fresh_real=("real", "median"), fresh_sim=("sim", "median"))
    out = fresh.join(calibration_metric(rec, repo, metric).rename("calibration"), how="left")
    out["ratio"] = out["fresh_real"] / out["calibration"]
    out["changed"] = (out["ratio"] > CHANGED) | (out["ratio"] < 1 / CHANGED)
    return out.reset_index()


def text(d: pd.DataFrame, calibration_commit: str, fresh_commits: list[str], metric: str = METRIC) -> str:
    """One sentence per model, and the reading where the server changed; "" where nothing to compare."""
    d = d.dropna(subset=["calibration"])
    if d.empty:
        return ""
    each = "; ".join(
        f"{r.model.removeprefix('config:')}: {r.calibration:.1f} ms in the calibration runs, {r.fresh_real:.1f} ms "
        f"real and {r.fresh_sim:.1f} ms simulated in the fresh runs"
        for r in d.itertuples()
    )
    at = ", ".join(sorted({c[:7] for c in fresh_commits if c})) or "?"
    out = (
        f"Real {metric} (median over runs), Study 1 at {calibration_commit[:7]} against the fresh runs at {at}: {each}."
    )
    moved = d[d["changed"]]
    if len(moved):
        names = ", ".join(m.removeprefix("config:") for m in moved["model"])
        out += (
            f" For {names} the server's decode changed between the two commits by more than a factor of {CHANGED}: "
            "the frozen serving terms describe the calibration runs' server, so this error measures a model frozen "
            "on another server. A freeze on today's Study 1 runs, checked on a new fresh run, would measure it on "
            "this one."
        )
    return out
