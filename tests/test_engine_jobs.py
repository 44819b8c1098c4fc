"""The engine page's GPU jobs in `make gpu-plan` (servelab.bench.jobs): listed while no complete run at today's
fingerprint of the benchmark's measuring path is recorded, run as their own commands, and judged stale on the page
by the same fingerprint."""

import json
import shutil
import subprocess
import sys

import pytest

from servelab.bench import jobs
from servelab.measure.fingerprint import fingerprint
from servelab.paths import REPO_ROOT
from servelab.studies.common import campaign
from servelab_book.engine_tables import render_code_status


def _sidecar(root, job, **meta):
    d = root / "nvidia-h200" / "engine"
    d.mkdir(parents=True, exist_ok=True)
    (d / job.sidecar).write_text(json.dumps(meta))
    return d


def test_both_engine_jobs_are_listed_until_a_complete_run_at_todays_fingerprint(tmp_path):
    assert [j.name for j in campaign.missing_engine_jobs(tmp_path)] == ["engine:bench:0", "engine:step_budget:0"]
    bench, budget = jobs.JOBS["bench"], jobs.JOBS["step_budget"]
    # a run before fingerprints were recorded (the bench's of f60ac54): stale, timed by its record
    _sidecar(tmp_path, bench, git_commit="f60ac54", wall_s=187.3, complete=True)
    listed = {j.part: j for j in campaign.missing_engine_jobs(tmp_path)}
    assert listed["bench"].minutes == round(187.3 / 60 + campaign.START_MIN, 1)
    assert listed["bench"].basis == "recorded (older code)" and listed["step_budget"].basis == "guess"
    today = fingerprint(budget.module).digest
    _sidecar(tmp_path, budget, fingerprint=today, complete=False, duration_s=60)  # cut short: not yet
    assert "step_budget" in {j.part for j in campaign.missing_engine_jobs(tmp_path)}
    _sidecar(tmp_path, budget, fingerprint=today, complete=True, duration_s=60)
    assert [j.name for j in campaign.missing_engine_jobs(tmp_path)] == ["engine:bench:0"]
    _sidecar(tmp_path, bench, fingerprint=fingerprint(bench.module).digest, complete=True, wall_s=180)
    assert campaign.missing_engine_jobs(tmp_path) == []
    # a CPU machine's run does not stand for the book's device
    cpu = tmp_path / "cpu-x86" / "engine"
    cpu.mkdir(parents=True)
    (cpu / "run.json").write_text("{}")
    assert campaign.missing_engine_jobs(tmp_path) == []


def test_the_bench_waits_for_smollm2s_weights_and_the_step_budget_does_not(monkeypatch):
    from servelab.models import loader

    def absent():
        raise loader.ModelLoadError("no GGUF")

    monkeypatch.setattr(loader, "smollm2_gguf", absent)
    assert "SmolLM2's GGUF not installed" in campaign.missing_here("engine", "bench")
    assert campaign.missing_here("engine", "step_budget") == ""
    assert [j.smollm2 for j in campaign.missing_engine_jobs(REPO_ROOT / "no-such-root")] == [True, False]


def test_the_plan_command_lists_the_engine_jobs_after_the_studies(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "servelab.studies.common.campaign", "plan", "--results", str(tmp_path), "engine"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    ).stdout
    assert "scripts/gpu_run.sh engine:" in out and "engine:step_budget:0" in out and "engine:bench:0" in out


def test_an_engine_job_runs_its_own_command(monkeypatch, capsys):
    ran = []

    class Done:
        returncode = 0

    from servelab.models import loader

    monkeypatch.setattr(campaign.subprocess, "run", lambda cmd, **k: ran.append(cmd) or Done())
    monkeypatch.setattr(loader, "smollm2_gguf", lambda: "/weights.gguf")  # the bench's exactness row reads them
    assert campaign.run_jobs(["engine:step_budget:0", "engine:bench:0"]) == 0
    assert ran[0][1:3] == ["-m", "servelab.bench.step_budget"] and "--time-budget" in ran[0]
    assert ran[1][1:3] == ["-m", "servelab.bench"]  # the package's door, not servelab.bench.run
    assert "job engine:bench:0 rc=0" in capsys.readouterr().out
    try:
        campaign.run_jobs(["engine:nothing:0"])
    except Exception as e:
        assert "its parts: ['bench', 'step_budget']" in str(e)
    else:
        raise AssertionError("an unknown engine part must be refused")


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory):
    """One step kind of the step budget on a CPU (seconds): its CSV and sidecar."""
    from servelab.bench import step_budget

    out = tmp_path_factory.mktemp("step_budget")
    args = step_budget.parse_args(["--model", "config:tiny-qwen2", "--device", "cpu", "--dtype", "float32"])
    plan = step_budget.make_plan(args)
    plan = type(plan)(**{**plan.__dict__, "kinds": plan.kinds[:1], "repeats": 1, "profiled_calls": 1})
    step_budget.run_budget(plan, out, log=lambda *a: None)
    return out


def test_the_step_budget_records_its_fingerprint_on_a_cpu(budget_run):
    side = json.loads((budget_run / jobs.JOBS["step_budget"].sidecar).read_text())
    assert side["complete"] and side["fingerprint"] == fingerprint("servelab.bench.step_budget").digest
    assert side["measuring_module"] == "servelab.bench.step_budget" and side["fingerprint_files"]


def test_the_engine_page_judges_the_bench_by_its_fingerprint(tmp_path):
    d = tmp_path / "engine"
    d.mkdir()
    (d / "bench.csv").write_text("metric,value\n")
    today = fingerprint(jobs.JOBS["bench"].module)
    (d / "run.json").write_text(json.dumps({"git_commit": "abc", **jobs.stamp("servelab.bench.run")}))
    assert "measuring code is today's" in render_code_status(d / "bench.csv")
    files = dict(today.files)
    files["lib/servelab/engine/scheduler.py"] = "0" * 16
    (d / "run.json").write_text(json.dumps({"git_commit": "abc", "fingerprint": "1" * 64, "fingerprint_files": files}))
    status = render_code_status(d / "bench.csv")
    assert "has changed since its run at commit `abc`" in status and "`engine/scheduler.py`" in status
    assert "engine:bench:0" in status


def test_the_step_budget_page_says_when_its_run_is_stale(budget_run, tmp_path):
    from servelab_book.engine_step_budget import step_budget_page

    for f in ("step_budget.csv", "step_budget.run.json"):
        shutil.copy(budget_run / f, tmp_path / f)
    csv = tmp_path / "step_budget.csv"
    assert "The step budget's measuring code is today's" in step_budget_page(csv).markdown
    side = json.loads((tmp_path / "step_budget.run.json").read_text())
    side["fingerprint"] = "2" * 64
    side["fingerprint_files"]["lib/servelab/kernels/gone.py"] = "0" * 16
    (tmp_path / "step_budget.run.json").write_text(json.dumps(side))
    page = step_budget_page(csv).markdown
    assert "has changed since" in page and "`kernels/gone.py`" in page and "engine:step_budget:0" in page
