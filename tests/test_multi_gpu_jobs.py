"""The Beyond-one-GPU page's jobs in `make gpu-plan` (``studies.common.multi_gpu``): listed while no complete run at
today's fingerprint is recorded, held back where the machine has too few GPUs, packed after every study's jobs, and
run as their own commands."""

import json

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common import campaign, multi_gpu


def _run(root, folder: str, part: str, repeat: int, complete: bool = True, fp: str | None = None):
    job = multi_gpu.JOBS[part]
    d = root / folder / multi_gpu.STUDY / "runs" / (fp or fingerprint(job.module).digest[:12]) / part / f"r{repeat}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"complete": complete, "duration_s": 240.0}))


def test_each_part_is_missing_until_a_complete_run_at_todays_fingerprint_on_the_books_device(tmp_path):
    parts = list(multi_gpu.JOBS)
    assert parts[:3] == ["tp1", "tp2", "tp4"] and "n1" in parts and "n4-prefix_affinity" in parts
    assert {(j.part, r) for j, r, _, _ in multi_gpu.missing(tmp_path, 3)} == {(p, r) for p in parts for r in range(3)}
    _run(tmp_path, "nvidia-h200-x4", "tp2", 0)
    _run(tmp_path, "nvidia-h200-x4", "tp2", 1, complete=False)  # cut short
    _run(tmp_path, "nvidia-h200-x4", "tp2", 2, fp="0123456789ab")  # older code
    _run(tmp_path, "cpu-x86", "n1", 0)  # a CPU's run stands for no H200
    _run(tmp_path, "nvidia-h200", "n1", 1)  # one replica: a one-GPU machine's
    left = {(j.part, r): (m, basis) for j, r, m, basis in multi_gpu.missing(tmp_path, 3)}
    assert ("tp2", 0) not in left and ("n1", 1) not in left
    assert {("tp2", 1), ("tp2", 2), ("tp1", 0), ("n1", 0), ("n1", 2)} <= set(left)
    assert left["tp2", 1] == (4.0, "recorded")
    assert left["n2-round_robin", 0] == (multi_gpu.JOBS["n1"].guess_min, "guess")


def test_a_job_is_held_back_on_a_machine_of_too_few_gpus_and_packed_after_every_studys(tmp_path):
    one = {j.name: j for j in campaign.missing_multi_gpu_jobs(tmp_path, 1, gpus=1)}
    assert one["09_beyond_one_gpu:n1:0"].held == ""
    assert all("needs a machine of 4 GPUs" in one[f"09_beyond_one_gpu:tp{n}:0"].held for n in (1, 2, 4))
    assert "needs a machine of 2 GPUs" in one["09_beyond_one_gpu:n2-round_robin:0"].held
    four = campaign.missing_multi_gpu_jobs(tmp_path, 1, gpus=4)
    assert all(j.held == "" for j in four) and len(four) == len(multi_gpu.JOBS)
    study = campaign.Job("08_simulator", "fresh_qwen2-0.5b", 2, 4.5, "guess")
    assert campaign.claim_tiers([*four, study])[0] == [study]
    assert campaign.claim_needs(multi_gpu.STUDY) == {}


def test_each_job_runs_as_its_own_command():
    _, _, tp = campaign._resolve(multi_gpu.STUDY, "tp2", 2, "full")
    assert tp[1:] == ["-m", "servelab.cluster.tp_run", "--sizes", "2", "--part", "tp2", "--repeat", "2"]
    _, _, n4 = campaign._resolve(multi_gpu.STUDY, "n4-round_robin", 0, "full")
    assert n4[1:] == ["-m", "servelab.studies.s08_simulator.cluster_run", "n4-round_robin", "--repeat", "0"]
    assert campaign.missing_here(multi_gpu.STUDY, "tp4") == ""
