"""The held-out protocol: freeze the cost model, register a fresh run, evaluate it once.

"Real" runs are made by the simulator with a known cost model (as in test_sim_validation), written in Study 1's
layout (``<slug>/01_scheduling/{requests,steps}.csv, run.json``); the cost-model "code" is a file in a scratch
repository, so that changing it is a real edit, not a patched hash."""

import datetime as dt
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from servelab.errors import ParameterError
from servelab.loadgen.metrics import records_for_csv
from servelab.sim import StepCostModel, simulate
from servelab.sim.cost_model import CostModel
from servelab.studies.s08_simulator import freeze, freeze_record, heldout, ledger
from servelab.studies.s08_simulator.study1_runs import server_limits, sim_kwargs_for

GPU = CostModel(
    "m",
    "test",
    {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
    {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-4},
    {},
)
TRUTH = StepCostModel(gpu=GPU, step_overhead_ms=1.0, seq_overhead_ms=0.05, ingress_ms=4.0)
LIMITS = {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "num_blocks": 4096, "block_size": 16}
POLICIES = (("chunked_prefill", 256), ("eager_cont_batch", 1024))
CODE = ("cost_model.py",)


def _utc(offset_s: float = 0.0) -> str:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_s)).isoformat(timespec="seconds")


def write_study1(
    results, seed: int, fractions: list[float], started_utc: str, n: int = 40, *, run_folder: bool = False
) -> None:
    """A Study 1 result the simulator made with ``TRUTH``: each policy at ``40 · fraction`` req/s; ``run_folder``:
    in the layout the studies' runs have (``<device>/<study>/runs/<fp>/<part>/r<k>/``, as the freeze reads Study
    1), else in the flat one a fresh papermill run writes."""
    reqs, steps = [], []
    for sched, budget in POLICIES:
        for i, frac in enumerate(fractions):
            rng = np.random.default_rng(seed * 1000 + i)
            rate = 40.0 * frac
            t = pd.DataFrame(
                {
                    "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                    "prompt_tokens": rng.integers(20, 400, n),
                    "output_tokens": rng.integers(5, 60, n),
                }
            )
            kw = sim_kwargs_for(server_limits(LIMITS))({"scheduler": sched, "budget": budget})
            run = simulate(t, cost=TRUTH, step_log=True, fast_forward=False, **kw)
            tag = {"model": "m", "scheduler": sched, "budget": budget, "rate": rate, "rate_fraction": frac}
            rec = run.records.drop(columns="replica").assign(**tag)
            reqs.append(rec.assign(target_output_tokens=t["output_tokens"].to_numpy()))
            steps.append(run.steps.drop(columns="replica").assign(**tag))
    d = results / "test-dev" / "01_scheduling"
    if run_folder:
        d = d / "runs" / "legacy" / "all" / "r0"
    d.mkdir(parents=True)
    records_for_csv(pd.concat(reqs, ignore_index=True)).to_csv(d / "requests.csv", index=False)
    pd.concat(steps, ignore_index=True).to_csv(d / "steps.csv", index=False)
    params = {"seed": seed, "rate_fractions": sorted(fractions), **LIMITS}
    run_json = {"git_commit": f"commit{seed}", "started_utc": started_utc, "params": params}
    if run_folder:
        run_json |= {"complete": True, "part": "all", "repeat_index": 0, "fingerprint": "legacy"}
    (d / "run.json").write_text(json.dumps(run_json))


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """A scratch repo (its cost-model code), Study 1's development runs, and a freeze of the model fitted on them."""
    base = tmp_path_factory.mktemp("heldout")
    (base / "repo").mkdir()
    (base / "repo" / CODE[0]).write_text("STEP_MS = 1.0\n")
    write_study1(base / "results", seed=0, fractions=[0.3, 0.7, 1.2], started_utc=_utc(-3600), run_folder=True)
    rec = freeze.freeze(root=base / "validation", results=base / "results", repo=base / "repo", files=CODE)
    return base, rec


@pytest.fixture
def tree(frozen, tmp_path):
    """A private copy of the frozen tree, and a spec ``fresh_run_1`` (seed 23, fractions 0.5 and 0.9)."""
    base, rec = frozen
    shutil.copytree(base, tmp_path / "t")
    t = tmp_path / "t"
    write_spec(t, "fresh_run_1", 23, [0.5, 0.9])
    return t, rec


def write_spec(t, run_id: str, seed: int, fractions: list[float]) -> None:
    spec = {"seed": seed, "rate_fractions": fractions, "budget_sweep": []}
    (t / "validation" / f"{run_id}.yaml").write_text(yaml.safe_dump(spec))


def kw(t) -> dict:
    return {"root": t / "validation", "repo": t / "repo"}


def test_freeze_records_code_inputs_models_and_the_used_runs(frozen):
    base, rec = frozen
    assert rec["code"]["files"] == {CODE[0]: ledger.file_sha256(base / "repo" / CODE[0])}
    assert {"requests.csv", "steps.csv", "run.json"} <= {p.split("/")[-1] for p in rec["calibration_inputs"]}
    assert list(rec["models"]) == ["m"]
    assert rec["calibration"]["seed"] == 0 and rec["calibration"]["rate_fractions"] == [0.3, 0.7, 1.2]
    held = rec["used_heldout"]
    assert held["runs"] == 2 and 0 <= held["median_abs_error_pct"] < 10  # the 0.7 run of each policy
    assert set(held["per_metric_median_abs_error_pct"]) >= {"p50 TTFT", "throughput"}
    book = ledger.read(base / "validation" / "ledger.csv")
    assert book[["run_id", "event", "seed", "rate_fractions"]].values.tolist() == [
        ["study1_test-dev_commit0", "development", "0", "0.3;0.7;1.2"]
    ]
    assert json.loads((base / "validation" / "sim_freeze.json").read_text()) == rec
    with pytest.raises(ParameterError, match="exists"):
        freeze.freeze(root=base / "validation", results=base / "results", repo=base / "repo", files=CODE)


def test_fresh_run_is_evaluated_once_and_recorded(tree):
    t, rec = tree
    (row,) = heldout.register("fresh_run_1", **kw(t))
    assert row["event"] == "registered" and row["code_sha256"] == rec["code"]["sha256"]
    write_study1(heldout.run_root("fresh_run_1", t / "validation"), seed=23, fractions=[0.5, 0.9], started_utc=_utc(60))
    row = heldout.report_once("fresh_run_1", **kw(t))
    assert row["event"] == "reported" and row["runs"] == 4  # two policies × two rates
    report = pd.read_csv(t / "validation" / "runs" / "fresh_run_1" / "heldout_report.csv")
    assert len(report) == 4 * 6 and row["median_abs_error_pct"] == pytest.approx(report["error_pct"].abs().median())
    assert 0 < row["median_abs_error_pct"] < 15  # a fitted model: close to the truth, not equal to it
    book = ledger.read(t / "validation" / "ledger.csv")
    assert book["event"].tolist() == ["development", "registered", "reported"]
    with pytest.raises(ParameterError, match="already used"):
        heldout.report_once("fresh_run_1", **kw(t))
    with pytest.raises(ParameterError, match="already used"):
        heldout.register("fresh_run_1", **kw(t))
    assert len(ledger.read(t / "validation" / "ledger.csv")) == 3  # the refusals wrote nothing
    st = ledger.status(book).set_index("run_id")["status"]
    assert st["fresh_run_1"] == "used (evaluated once)" and st["study1_test-dev_commit0"] == "used during development"


def test_evaluation_replays_without_refitting():
    """The true cost model replays its own runs exactly: the evaluation adds no error of its own."""
    import tempfile
    from pathlib import Path

    from servelab.studies.s08_simulator.study1_runs import load_study1

    with tempfile.TemporaryDirectory() as d:
        write_study1(Path(d), seed=5, fractions=[0.5], started_utc=_utc())
        requests, _, params, _ = load_study1(Path(d))
    table = heldout.evaluate(requests, params, {"m": TRUTH})
    # what is left is the CSV's rounding of token times to 1 µs (records_for_csv), against ITLs of a few ms
    assert len(table) == 2 * 6 and table["error_pct"].abs().max() < 0.05
    off = heldout.evaluate(requests, params, {"m": TRUTH.with_overheads(step_overhead_ms=3.0)})
    assert off["error_pct"].abs().median() > 5
    with pytest.raises(ParameterError, match="no frozen cost model"):
        heldout.evaluate(requests, params, {"other": TRUTH})


def test_changed_cost_model_code_is_refused(tree):
    t, _ = tree
    heldout.register("fresh_run_1", **kw(t))
    write_study1(heldout.run_root("fresh_run_1", t / "validation"), seed=23, fractions=[0.5, 0.9], started_utc=_utc(60))
    (t / "repo" / CODE[0]).write_text("STEP_MS = 0.9  # tuned after the freeze\n")
    with pytest.raises(ParameterError, match=r"changed since the freeze .*cost_model\.py"):
        heldout.report_once("fresh_run_1", **kw(t))
    with pytest.raises(ParameterError, match="changed since the freeze"):
        heldout.register("fresh_run_1", **kw(t))
    assert "differs from it" in heldout.section(**kw(t))
    (t / "repo" / CODE[0]).write_text("STEP_MS = 1.0\n")  # back as frozen: accepted
    assert heldout.report_once("fresh_run_1", **kw(t))["event"] == "reported"


def test_edited_frozen_model_is_refused(tree):
    t, rec = tree
    heldout.register("fresh_run_1", **kw(t))
    write_study1(heldout.run_root("fresh_run_1", t / "validation"), seed=23, fractions=[0.5, 0.9], started_utc=_utc(60))
    path = t / "validation" / rec["models"]["m"]["file"]
    d = json.loads(path.read_text())
    d["step_overhead_ms"] *= 1.1
    path.write_text(json.dumps(d))
    with pytest.raises(ParameterError, match="edited after the freeze"):
        heldout.report_once("fresh_run_1", **kw(t))


def test_used_seeds_and_rates_cannot_be_fresh(tree):
    t, _ = tree
    write_spec(t, "same_seed", 0, [0.5])
    with pytest.raises(ParameterError, match="seed 0 was used"):
        heldout.register("same_seed", **kw(t))
    write_spec(t, "used_rate", 7, [0.5, 0.7])
    with pytest.raises(ParameterError, match=r"rate fractions \[0.7\] were used"):
        heldout.register("used_rate", **kw(t))
    write_spec(t, "bad", 7, "0.5")
    with pytest.raises(ParameterError, match="rate_fractions must be"):
        heldout.register("bad", **kw(t))
    with pytest.raises(ParameterError, match="no spec"):
        heldout.register("missing", **kw(t))


def test_run_must_be_registered_match_its_spec_and_follow_its_registration(tree):
    t, _ = tree
    runs = heldout.run_root("fresh_run_1", t / "validation")
    write_study1(runs, seed=23, fractions=[0.5, 0.9], started_utc=_utc(60))
    with pytest.raises(ParameterError, match="never registered"):
        heldout.report_once("fresh_run_1", **kw(t))
    heldout.register("fresh_run_1", **kw(t))
    write_spec(t, "fresh_run_1", 23, [0.5, 0.8])  # the spec edited after its registration
    with pytest.raises(ParameterError, match="changed after its registration"):
        heldout.report_once("fresh_run_1", **kw(t))
    write_spec(t, "fresh_run_1", 23, [0.5, 0.9])
    shutil.rmtree(runs)
    write_study1(runs, seed=23, fractions=[0.5, 0.9], started_utc=_utc(-600))  # its data predates the registration
    with pytest.raises(ParameterError, match="before its registration"):
        heldout.report_once("fresh_run_1", **kw(t))
    shutil.rmtree(runs)
    write_study1(runs, seed=24, fractions=[0.5, 0.9], started_utc=_utc(60))  # run with another seed than its spec's
    with pytest.raises(ParameterError, match="its seed is 24"):
        heldout.report_once("fresh_run_1", **kw(t))


def test_a_refreeze_voids_earlier_registrations(tree):
    """The model changed after a registration, and was frozen again: the registered run is no longer fresh for it."""
    t, _ = tree
    heldout.register("fresh_run_1", **kw(t))
    (t / "repo" / CODE[0]).write_text("STEP_MS = 0.9\n")
    freeze.freeze(root=t / "validation", results=t / "results", repo=t / "repo", files=CODE, replace=True)
    book = ledger.read(t / "validation" / "ledger.csv")
    assert (book["event"] == "development").sum() == 1  # the same development data is recorded once
    write_study1(heldout.run_root("fresh_run_1", t / "validation"), seed=23, fractions=[0.5, 0.9], started_utc=_utc(-1))
    with pytest.raises(ParameterError, match="registered under an earlier freeze"):
        heldout.report_once("fresh_run_1", **kw(t))
    heldout.register("fresh_run_1", **kw(t))  # registered again under the new freeze, but its data came first
    with pytest.raises(ParameterError, match="before its registration"):
        heldout.report_once("fresh_run_1", **kw(t))


def test_page_section_names_fresh_and_used_runs(tree, tmp_path, monkeypatch):
    t, rec = tree
    assert "has not been frozen" in heldout.section(root=tmp_path / "none", repo=t / "repo")
    heldout.register("fresh_run_1", **kw(t))
    assert "CPU stand-ins" in heldout.section(**kw(t))
    monkeypatch.setenv("SERVELAB_RESULTS", str(t / "results"))  # the page replayed the development runs
    text = heldout.section(**kw(t), study1_slug="test-dev")
    assert "they are ledger run `study1_test-dev_commit0`" in text
    write_study1(t / "other", seed=9, fractions=[0.4], started_utc=_utc())
    monkeypatch.setenv("SERVELAB_RESULTS", str(t / "other"))  # a Study 1 re-run the model was not developed on
    assert "are not in the ledger" in heldout.section(**kw(t), study1_slug="test-dev")
    assert "the code here matches it" in text and rec["code"]["sha256"][:12] in text
    assert f"{rec['used_heldout']['median_abs_error_pct']:.1f} %" in text
    assert "| study1_test-dev_commit0 | used during development |" in text
    assert "| fresh_run_1 | fresh (registered, not yet evaluated) |" in text and "0.5, 0.9" in text
    write_study1(heldout.run_root("fresh_run_1", t / "validation"), seed=23, fractions=[0.5, 0.9], started_utc=_utc(60))
    row = heldout.report_once("fresh_run_1", **kw(t))
    text = heldout.section(**kw(t))
    assert "| fresh_run_1 | used (evaluated once) |" in text and f"{row['median_abs_error_pct']:.1f} |" in text


def test_ledger_refuses_unknown_events(tmp_path):
    with pytest.raises(ParameterError, match="event"):
        ledger.append(tmp_path / "l.csv", {"run_id": "x", "event": "peeked"})
    with pytest.raises(ParameterError, match="only"):
        ledger.append(tmp_path / "l.csv", {"run_id": "x", "event": "registered", "verdict": "holds"})
    assert not (tmp_path / "l.csv").exists()


def test_committed_freeze_and_spec_are_whole():
    """The repository's freeze names its files, its frozen models match their recorded hashes, and the fresh spec
    is a valid Study 1 parameter set whose seed and rates no used run had. (Whether the code still matches the
    freeze is for ``report_once`` to refuse and the page to say, not for CI: the model may change, then a new
    freeze and a new fresh run are needed.)"""
    from servelab.studies.s01_scheduling.params import study_params

    rec = freeze_record.load_freeze()
    assert set(rec["code"]["files"]) == set(freeze_record.MODEL_FILES)
    assert set(freeze_record.frozen_models(rec)) == set(rec["models"])
    spec = heldout.load_spec("fresh_run_1")
    p = study_params("full", **spec)
    assert p["seed"] == spec["seed"] and p["budget_sweep"] == []
    heldout._check_fresh(spec, ledger.read(freeze_record.VALIDATION_DIR / freeze_record.LEDGER_FILE), "fresh_run_1")


def test_a_campaigns_repeats_register_one_seed_each_and_none_used_before(tree):
    t, _ = tree
    rows = heldout.register("fresh_run_1", **kw(t), repeats=3)
    assert [r["seed"] for r in rows] == [23, 24, 25] and {r["event"] for r in rows} == {"registered"}
    assert rows[2]["note"].endswith("; the campaign's repeat 3 of 3, data id r2 (spec seed + 2)")
    write_spec(t, "near_dev", -2, [0.55])  # seeds -2, -1, 0: the last is the development runs'
    with pytest.raises(ParameterError, match="seed 0 was used"):
        heldout.register("near_dev", **kw(t), repeats=3)


def test_the_ledger_status_voids_registrations_of_an_earlier_freeze_and_ranges_repeat_seeds():
    book = pd.DataFrame(
        [
            dict(run_id="a", event="registered", utc="t0", freeze_sha256="old", seed=23, rate_fractions="0.5",
                 runs="", median_abs_error_pct="", note=""),
            *[dict(run_id="b", event="registered", utc="t1", freeze_sha256="new", seed=s, rate_fractions="0.6",
                   runs="", median_abs_error_pct="", note="") for s in (41, 42, 43)],
        ]
    )  # fmt: skip
    st = ledger.status(book, "new").set_index("run_id")
    assert st.loc["a", "status"].startswith("void") and st.loc["b", "status"].startswith("fresh")
    assert st.loc["b", "seed"] == "41–43" and st.loc["a", "seed"] == 23


def write_campaign_repeat(t, rec, k: int, seed: int, *, code: str | None = None, started_utc: str | None = None):
    """Repeat ``k`` of the simulator's fresh part as the campaign writes it (``08_simulator/runs/<fp>/fresh_m/r<k>``):
    the Study 1 records of a fresh run with ``seed``, its parameters, seed record and freeze check."""
    scratch = t / f"scratch{k}"
    shutil.rmtree(scratch, ignore_errors=True)
    write_study1(scratch, seed=seed, fractions=[0.5, 0.9], started_utc=_utc())
    d = t / "results" / "test-dev" / "08_simulator" / "runs" / "abcabcabcabc" / "fresh_m" / f"r{k}"
    d.mkdir(parents=True)
    shutil.copy(scratch / "test-dev" / "01_scheduling" / "requests.csv", d / "fresh_requests.csv")
    params = {"seed": seed, "rate_fractions": [0.5, 0.9], **LIMITS}
    (d / "fresh_params.json").write_text(json.dumps(params))
    (d / "fresh_seed.json").write_text(json.dumps({"fresh_run": "fresh_run_1", "seed": seed}))
    (d / "freeze_check.json").write_text(json.dumps({"code_sha256": code or rec["code"]["sha256"]}))
    meta = {"fingerprint": "abcabcabcabc", "part": "fresh_m", "repeat_index": k, "complete": True,
            "started_utc": started_utc or _utc(), "git_commit": f"c{k}" * 20}  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))


def test_the_campaigns_repeats_are_each_evaluated_once(tree):
    from servelab.studies.common.runs import study_runs

    t, rec = tree
    heldout.register("fresh_run_1", repeats=2, **kw(t))
    for k in range(2):
        write_campaign_repeat(t, rec, k, 23 + k)
    runs = study_runs("08_simulator", t / "results", device="test-dev")
    rows = heldout.report_campaign("fresh_run_1", runs, **kw(t))
    assert [r["seed"] for r in rows] == [23, 24] and all(r["runs"] == 4 for r in rows)
    assert rows[1]["note"].startswith("the campaign's repeat with data id r1 (fresh_m), run at")
    assert all(0 < r["median_abs_error_pct"] < 15 for r in rows)
    assert heldout.report_campaign("fresh_run_1", runs, **kw(t)) == []  # once: nothing is evaluated again
    book = ledger.read(t / "validation" / "ledger.csv")
    (st,) = heldout.status(book)[lambda d: d["run_id"] == "fresh_run_1"].itertuples()
    assert st.seed == "23–24" and st.runs == "8" and "each of 2 repeats" in st.status
    errs = sorted(r["median_abs_error_pct"] for r in rows)
    assert float(st.median_abs_error_pct) == pytest.approx(sum(errs) / 2, rel=1e-3)


def test_a_campaign_repeat_that_is_not_fresh_is_refused(tree):
    from servelab.studies.common.runs import study_runs

    t, rec = tree
    heldout.register("fresh_run_1", **kw(t))  # seed 23 only
    write_campaign_repeat(t, rec, 0, 23, code="0" * 64)
    runs = study_runs("08_simulator", t / "results", device="test-dev")
    with pytest.raises(ParameterError, match="other than the frozen code"):
        heldout.report_campaign("fresh_run_1", runs, **kw(t))
    shutil.rmtree(t / "results" / "test-dev" / "08_simulator")
    write_campaign_repeat(t, rec, 0, 23, started_utc=_utc(-7200))
    runs = study_runs("08_simulator", t / "results", device="test-dev")
    with pytest.raises(ParameterError, match="before its registration"):
        heldout.report_campaign("fresh_run_1", runs, **kw(t))
    shutil.rmtree(t / "results" / "test-dev" / "08_simulator")
    write_campaign_repeat(t, rec, 1, 24)
    runs = study_runs("08_simulator", t / "results", device="test-dev")
    with pytest.raises(ParameterError, match="not registered"):
        heldout.report_campaign("fresh_run_1", runs, **kw(t))


def test_a_campaign_repeat_committed_in_xz_reads_and_hashes_as_its_plain_copy(tree):
    """The fresh runs' tables are committed in xz (scripts/compress_runs.sh): the report must read the same records
    and give the same data hash, or the used-data check would miss a repeat reported from the other form."""
    import lzma

    from servelab.studies.common.runs import study_runs

    t, rec = tree
    write_campaign_repeat(t, rec, 0, 23)
    (plain,) = heldout.campaign_repeats(study_runs("08_simulator", t / "results", device="test-dev"))
    csv = next((t / "results").rglob("fresh_requests.csv"))
    with lzma.open(csv.with_name("fresh_requests.csv.xz"), "wb") as f:
        f.write(csv.read_bytes())
    csv.unlink()
    (packed,) = heldout.campaign_repeats(study_runs("08_simulator", t / "results", device="test-dev"))
    assert packed["data_sha256"] == plain["data_sha256"]
    pd.testing.assert_frame_equal(packed["requests"], plain["requests"])
    assert len(plain["requests"]) > 0
