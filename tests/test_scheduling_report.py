"""Study 1's two doors: the measuring path's fingerprint holds no reporting module; the report reads run folders
(raw requests and points), empty or zero data says "not measured" or "below the lowest rate", never crashes; the
verdict follows the rule applied to the raw requests."""

import json

import numpy as np
import pandas as pd
import pytest

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import study_runs
from servelab.studies.s01_scheduling import measure, plots, report
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.params import study_params

STUDY = "01_scheduling"


def test_measure_fingerprint_holds_no_reporting_module():
    files = fingerprint("servelab.studies.s01_scheduling.measure").files
    bad = [f for f in files if any(x in f for x in ("report", "plots", "verdicts", "/page", "servelab_book"))]
    assert bad == []
    assert "lib/servelab/studies/s01_scheduling/measure.py" in files


def test_parts_select_points_and_fit_a_gpu_run():
    P = study_params("full")
    assert set(measure.PARTS) == set(measure.PART_SELECTORS)
    assert all(0 < m <= 7.0 for m in measure.PARTS.values())
    from servelab.studies.s01_scheduling.sweep import plan_points

    seen = []
    for part in measure.PARTS:
        Pp = measure.part_params({**P, "part": part})
        seen += [(m, p.scheduler, p.budget, p.rate_fraction, p.sweep) for m in P["models"] for p in plan_points(Pp, m)]
    every = [(m, p.scheduler, p.budget, p.rate_fraction, p.sweep) for m in P["models"] for p in plan_points(P, m)]
    assert sorted(seen) == sorted(every)  # every point in exactly one part
    with pytest.raises(Exception, match="no part"):
        measure.part_params({**P, "part": "nope"})


def test_full_profile_sizes_every_point_for_150_requests_and_three_rates():
    P = study_params("full")
    assert P["min_requests"] >= 150 and len(P["rate_fractions"]) == 3 and P["budget_sweep"] == [128, 256, 1024, 4096]
    assert P["search_steps"] >= 1 and set(P["capacities"]) == set(P["models"]) == set(P["slo_itl_ms"])


def test_empty_runset_is_not_measured(tmp_path):
    r = report.report(study_runs(STUDY, tmp_path))
    assert {f.verdict for f in r.findings} == {"inconclusive"}
    assert r.summary.empty and r.capacity.empty
    assert report.published_value(r.runs) is None
    plots.capacity_bars(r.capacity, "H200")  # says "not measured", no log axis over nothing
    assert "not measured" in report.capacity_view(r.capacity).iloc[0, 0]


def test_zero_capacity_shape_does_not_crash_and_says_below_lowest_rate():
    """The shape HEAD's H200 run gave: every setting missed the SLO at every rate (capacity 0.0 then)."""
    summary = pd.DataFrame(
        {
            "model": "config:qwen2-0.5b",
            "scheduler": ["eager_cont_batch", "chunked_prefill"] * 2,
            "budget": [8192, 512] * 2,
            "rate": [2.0, 2.0, 4.0, 4.0],
            "rate_fraction": [0.3, 0.3, 0.7, 0.7],
            "sweep": "rate",
            "status": "ok",
            "itl_p99_ms": [90.0, 80.0, 95.0, 85.0],
            "cut": 0,
            "failed": 0,
            "slo_itl_ms": 20.0,
        }
    )
    cap = capacity_table(summary)
    assert cap["capacity_req_s"].isna().all() and (cap["bound"] == "below lowest rate").all()
    fig = plots.capacity_bars(cap, "H200")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("below the lowest rate" in t for t in texts)
    view = report.capacity_view(cap)
    assert view["capacity at the SLO"].str.startswith("below the lowest rate").all()
    assert all("no setting met" in s for s in report.capacity_sentences(cap))


def _records(rate, n, gap_ms, stall_ms, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t0 = i / rate
        gaps = np.full(20, gap_ms / 1e3)
        if rng.random() < 0.5:
            gaps[5] = stall_ms / 1e3
        times = list(np.round(t0 + 0.01 + np.concatenate([[0], np.cumsum(gaps)]), 6))
        rows.append(
            dict(
                request_id=i, arrival_s=t0, prompt_tokens=100, output_tokens=21, sent_s=t0, first_token_s=times[0],
                finish_s=times[-1], token_times_s=json.dumps(times), ok=True, error=np.nan, target_output_tokens=21,
            )
        )  # fmt: skip
    return pd.DataFrame(rows)


def _write_runs(root, chunked_stall_ms: float, repeats: int = 3, part: str = "all"):
    for r in range(repeats):
        d = root / "cpu-test" / STUDY / "runs" / "abc123abc123" / part / f"r{r}"
        d.mkdir(parents=True)
        reqs, pts = [], []
        for sched, budget, stall in (("eager_cont_batch", 8192, 100.0), ("chunked_prefill", 512, chunked_stall_ms)):
            for f, rate in ((0.3, 3.0), (0.7, 6.0)):
                rec = _records(rate, 150, 5.0, stall, seed=r * 10 + int(f * 10))
                head = dict(model="config:qwen2-0.5b", scheduler=sched, budget=budget, rate=rate, rate_fraction=f)
                reqs.append(rec.assign(**head, sweep="rate"))
                pts.append(
                    {**head, "sweep": "rate", "status": "ok", "attempts": 1, "min_requests": 150, "window_s": 50.0,
                     "deadline_s": 55.0, "duration_s": 52.0, "slo_itl_ms": 20.0, "warmup_ms": 1.0}
                )  # fmt: skip
        pd.concat(reqs).to_csv(d / "requests.csv", index=False)
        pd.DataFrame(pts).to_csv(d / "points.csv", index=False)
        meta = {"complete": True, "fingerprint": "abc123abc123", "part": part, "repeat_index": r, "seed": r,
                "params": {"reference_budget": 512, "dtype": "float32", "rate_fractions": [0.3, 0.7]},
                "git_commit": "x", "written_utc": "2026"}  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta))


def test_report_applies_the_rule_to_raw_requests_and_a_changed_csv_changes_it(tmp_path):
    _write_runs(tmp_path, chunked_stall_ms=60.0)  # p99 stall 100 -> 60 ms: a 40% cut
    r = report.report(study_runs(STUDY, tmp_path))
    f11 = next(f for f in r.findings if f.id == "F1.1")
    assert f11.verdict == "holds" and f11.repeats == 3 and abs(f11.headline - 40.0) < 1.0
    assert len(r.capacity) == 2 and r.capacity["bound"].eq("below lowest rate").all()  # p99 ITL ~100/60 ms > 20
    # the acceptance check: the same runs with ChunkedPrefill's stalls at 99 ms in requests.csv: no cut, fails
    shutil_root = tmp_path / "other"
    _write_runs(shutil_root, chunked_stall_ms=99.0)  # almost no cut
    f11b = next(f for f in report.report(study_runs(STUDY, shutil_root)).findings if f.id == "F1.1")
    assert f11b.verdict == "fails"


def test_the_capacity_takeaway_names_the_parts_it_rests_on_while_some_wait(tmp_path):
    _write_runs(tmp_path / "one", chunked_stall_ms=60.0, repeats=1, part="llama-fcfs-high")
    text = report.takeaways(report.report(study_runs(STUDY, tmp_path / "one")))
    assert "From the parts measured so far (llama-fcfs-high), not yet qwen-eager-chunked512" in text
    _write_runs(tmp_path / "whole", chunked_stall_ms=60.0, repeats=1)
    assert "measured so far" not in report.takeaways(report.report(study_runs(STUDY, tmp_path / "whole")))


def test_one_repeat_is_inconclusive_but_keeps_its_verdict(tmp_path):
    _write_runs(tmp_path, chunked_stall_ms=60.0, repeats=1)
    f11 = next(f for f in report.report(study_runs(STUDY, tmp_path)).findings if f.id == "F1.1")
    assert f11.verdict == "inconclusive" and f11.repeat_verdicts == "holds"


def test_legacy_run_reads_from_raw_requests():
    """The committed legacy run: F1.1 on qwen2-0.5b holds (a 69.66% cut over its two served rates), recomputed from
    requests.csv, not read from its findings.csv."""
    from servelab.paths import DATA_DIR

    runs = study_runs(STUDY, DATA_DIR / "results", device="h200").at("legacy")
    rep = runs.repeat(runs.repeats[0])
    s = report.repeat_summary(rep)
    from servelab.studies.s01_scheduling import verdicts

    j = verdicts.paired(s, 512).dropna(subset=["stall_cut_p99"])
    q = j[j["model"] == "config:qwen2-0.5b"]
    assert len(q) == 2 and abs(100 * np.median(q["stall_cut_p99"]) - 69.66) < 0.01
    f11 = next(f for f in report.repeat_findings(rep) if f.id == "F1.1")
    assert "qwen2-0.5b: holds" in f11.note


def test_the_published_row_names_the_best_setting_as_the_prose_does_and_the_baseline_once():
    from servelab.studies.s01_scheduling.report import published_value_from

    row = dict(slo_itl_ms=20.0, lowest_rate=7.8, highest_rate=62.3, rates=4.0, n_repeats=3, bound="within sweep")
    cap = pd.DataFrame(
        [
            dict(model="config:qwen2-0.5b", scheduler="chunked_prefill", budget=512, capacity_req_s=7.8,
                 first_miss_rate=15.6, **row),
            dict(model="config:qwen2-0.5b", scheduler="eager_cont_batch", budget=8192, capacity_req_s=15.6,
                 first_miss_rate=36.3, **row),
            dict(model="config:llama-3-8b", scheduler="chunked_prefill", budget=2048, capacity_req_s=6.0,
                 first_miss_rate=7.0, **row),
            dict(model="config:llama-3-8b", scheduler="eager_cont_batch", budget=8192, capacity_req_s=3.0,
                 first_miss_rate=6.0, **row),
        ]
    )  # fmt: skip
    text, _ = published_value_from(cap)
    assert text.startswith("qwen2-0.5b: best EagerContBatch itself, 15.6 req/s (missed at 36.3 req/s)")
    assert "llama-3-8b: best ChunkedPrefill@2048 6 req/s (missed at 7 req/s), EagerContBatch 3 req/s" in text
    tied, _ = published_value_from(cap.assign(capacity_req_s=[7.8, 7.8, 6.0, 3.0]))
    assert "best ChunkedPrefill@512 = EagerContBatch (tied)" in tied


def test_a_model_with_no_run_at_the_middle_rate_gets_a_line_not_a_figure():
    steps = pd.DataFrame({"model": ["config:qwen2-0.5b"] * 2, "sweep": ["rate", "budget"], "rate_fraction": [0.7, 0.4]})
    assert report.at_rate(steps, "config:qwen2-0.5b", 0.7)
    assert not report.at_rate(steps, "config:qwen2-0.5b", 0.4)  # the budget sweep's point is not the rate sweep's
    assert not report.at_rate(steps, "config:llama-3-8b", 0.7) and not report.at_rate(pd.DataFrame(), "x", 0.7)
    line = report.not_at_rate("config:llama-3-8b", 0.7)
    assert "llama-3-8b" in line and "0.7×" in line and "make gpu-plan" in line


def test_each_claim_waits_only_for_the_parts_holding_the_settings_its_rule_reads():
    """F1.1 and F1.2 pair EagerContBatch with ChunkedPrefill at the reference budget, so a repeat judges them once
    those parts ran, whether or not FCFS or the budget sweep did; F1.3 ranks every rate-sweep setting of both models
    (FCFS's three rate parts on the 8B shape included), and no claim waits for the budget sweep."""
    from servelab.studies.s01_scheduling.measure import PARTS
    from servelab.studies.s01_scheduling.report import NEEDS, parts_holding

    assert NEEDS["F1.1"] == NEEDS["F1.2"] == ("qwen-eager-chunked512", "llama-eager", "llama-chunked512")
    assert parts_holding("fcfs") == ("qwen-fcfs-chunked2048", "llama-fcfs-low", "llama-fcfs-mid", "llama-fcfs-high")
    budget = {"llama-budget-small", "llama-budget-large"}
    assert set(NEEDS["F1.3"]) == set(PARTS) - budget


def test_the_paired_parts_alone_judge_f11_and_f12_while_f13_waits_for_the_rest(tmp_path):
    for part in report.NEEDS["F1.1"]:
        _write_runs(tmp_path, chunked_stall_ms=60.0, part=part)
    got = {f.id: f for f in report.report(study_runs(STUDY, tmp_path)).findings}
    assert got["F1.1"].verdict == "holds" and got["F1.1"].repeats == 3
    assert got["F1.2"].repeats == 3
    assert got["F1.3"].repeats == 0 and "llama-fcfs-mid" in got["F1.3"].note


def test_the_takeaways_give_each_models_verdict_over_the_repeats(tmp_path):
    _write_runs(tmp_path, chunked_stall_ms=60.0)
    r = report.report(study_runs(STUDY, tmp_path))
    assert r.per_model["F1.1"] == "Per model over the 3 repeats: qwen2-0.5b holds in each"
    assert "stall cut 40%. Per model over the 3 repeats: qwen2-0.5b holds in each." in report.takeaways(r)
    # one repeat has nothing to compare across repeats: no sentence
    _write_runs(tmp_path / "single", chunked_stall_ms=60.0, repeats=1)
    assert report.report(study_runs(STUDY, tmp_path / "single")).per_model == {}


def test_a_tie_for_the_highest_capacity_names_every_setting_in_it():
    # the takeaway named one winner ("is eager_cont_batch's") where the table and the published row showed a tie
    cap = pd.DataFrame(
        {
            "model": "config:qwen2-0.5b",
            "scheduler": ["eager_cont_batch", "chunked_prefill", "fcfs"],
            "budget": [8192, 2048, 8192],
            "capacity_req_s": [15.6, 15.6, 7.8],
            "first_miss_rate": [36.3, 36.3, 15.6],
            "bound": "bracketed",
            "slo_itl_ms": 20.2,
            "lowest_rate": 7.8,
        }
    )
    said = report.capacity_sentences(cap)[0]
    assert said == (
        "qwen2-0.5b: EagerContBatch and ChunkedPrefill@2048 tie for the highest capacity at p99 ITL ≤ 20.2 ms, "
        "15.6 req/s (missed at 36.3 req/s)."
    )
    alone = report.capacity_sentences(cap.assign(capacity_req_s=[15.6, 7.8, 7.8]))[0]
    assert alone.startswith("qwen2-0.5b: the highest capacity at p99 ITL ≤ 20.2 ms is EagerContBatch's, 15.6 req/s")


def test_the_methods_numbers_come_from_the_runs():
    from servelab.paths import REPO_ROOT
    from servelab.studies.common.runs import study_runs

    runs = study_runs("01_scheduling", REPO_ROOT / "data" / "results")
    said = report.method_numbers(runs)
    p = runs.params
    assert f"sized for {p['min_requests']:g} completed requests (`min_requests`)" in said
    assert f"a factor of {p['search_factor']:g} (`search_factor`)" in said
    assert said.endswith(f"ran seeds {', '.join(str(r.params['seed']) for r in runs.per_repeat()[:-1])} and "
                         f"{runs.per_repeat()[-1].params['seed']}.")  # fmt: skip
