"""The simulator page's two doors: the measuring path's closure, and the report from files (empty, synthetic)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s08_simulator import report, sections

STUDY = "08_simulator"


def test_measure_closure_has_no_reporting_module():
    files = fingerprint("servelab.studies.s08_simulator.measure").files
    bad = [f for f in files if any(w in f for w in ("plots", "report", "verdicts", "page", "sections", "takeaways"))]
    bad += [f for f in files if "servelab_book" in f or "studies/common/runs" in f or "studies/common/study" in f]
    assert bad == []
    assert "lib/servelab/studies/s08_simulator/freeze_record.py" in files  # the code hash it records


def test_report_on_nothing_is_not_measured():
    page = report.report(RunSet(STUDY))
    assert [f.id for f in page.findings] == ["F2.3"]
    assert page.findings[0].verdict == "inconclusive" and "Not measured" in page.findings[0].note
    assert page["sim_validation"].empty and not page.speed and not page.fresh
    assert report.published_value(RunSet(STUDY)) is None
    assert "Not measured" in sections.heldout_text(page)


def _speed_run(root, hour_wall_s: float):
    d = root / "nvidia-h200" / STUDY / "runs" / "abc123abc123" / "speed" / "r0"
    d.mkdir(parents=True)
    row = dict(rate=100.0, replicas=8, router="least_outstanding", scheduler="chunked_prefill", simulated_s=3600.0,
               requests=360000, steps=4500000, wall_s=hour_wall_s, cpu_s=hour_wall_s, sim_requests_per_s=360000 /
               hour_wall_s, sim_steps_per_s=1.0, hour_wall_s=hour_wall_s, hour_extrapolated=False, goal_s=60.0,
               meets_goal=hour_wall_s <= 60, completed=360000, ttft_p99_ms=70.0, lengths="x")  # fmt: skip
    pd.DataFrame([row]).to_csv(d / "sim_speed.csv", index=False)
    dev = {"name": "NVIDIA H200", "slug": "nvidia-h200", "kind": "cuda"}
    meta = {"study": STUDY, "fingerprint": "abc123abc123", "part": "speed", "repeat_index": 0, "complete": True,
            "device": dev, "params": {"seed": 0}}  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))
    return d


def test_report_reads_the_measured_speed_and_nothing_else(tmp_path):
    d = _speed_run(tmp_path, 38.0)
    runs = study_runs(STUDY, tmp_path)
    page = report.report(runs)
    assert page.speed["hour_wall_s"] == 38.0 and "within" in sections.tk.speed(page)
    # no Study 1 under this root: nothing to calibrate on, F2.3 not measured, no crash
    assert page.findings[0].verdict == "inconclusive" and page["sim_validation"].empty
    assert "Not measured" in sections.heldout_text(page)
    # the acceptance check: a number in the raw CSV moves what the page says
    s = pd.read_csv(d / "sim_speed.csv").assign(hour_wall_s=75.0)
    s.to_csv(d / "sim_speed.csv", index=False)
    page = report.report(study_runs(STUDY, tmp_path))
    assert page.speed["hour_wall_s"] == 75.0 and "over" in sections.tk.speed(page)


def _fresh_run(root, requests: pd.DataFrame, seed: int, fp: str = "abc123abc123"):
    """A synthetic fresh held-out run: one part, one repeat, the raw request records of Study 1's legacy run."""
    from servelab.studies.s08_simulator import measure

    d = root / "nvidia-h200" / STUDY / "runs" / fp / "fresh_qwen2-0.5b" / "r0"
    d.mkdir(parents=True)
    requests.to_csv(d / "fresh_requests.csv", index=False)
    legacy = json.loads((_LEGACY1 / "run.json").read_text())
    params = {**legacy["params"], "step_graphs": True, "fresh_run": "fresh_run_5", "seed": seed}
    (d / "fresh_params.json").write_text(json.dumps(params))
    (d / "fresh_seed.json").write_text(json.dumps(measure.seed_record({"fresh_run": "fresh_run_5", "seed": seed - 50})))
    (d / "freeze_check.json").write_text(json.dumps(measure.freeze_check()))
    dev = {"name": "NVIDIA H200", "slug": "nvidia-h200", "kind": "cuda"}
    meta = {"study": STUDY, "fingerprint": fp, "part": "fresh_qwen2-0.5b", "repeat_index": 0, "complete": True,
            "device": dev, "params": {"seed": seed - 50}}  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))
    return d


_LEGACY1 = Path(__file__).resolve().parents[1] / "data/results/nvidia-h200/01_scheduling/runs/legacy/all/r0"


def _one_legacy_run() -> pd.DataFrame:
    req = pd.read_csv(_LEGACY1 / "requests.csv", keep_default_na=False, na_values=[""])
    req["error"] = req["error"].fillna("")
    key = req[["model", "scheduler", "budget", "rate"]].iloc[0]
    one = req[(req[["model", "scheduler", "budget", "rate"]] == key).all(axis=1)]
    assert one["model"].iloc[0] == "config:qwen2-0.5b" and len(one) > 5
    return one


def test_fresh_run_error_and_seeds_come_from_the_raw_csv(tmp_path):
    req = _one_legacy_run()
    d = _fresh_run(tmp_path, req, seed=50)
    page = report.report(study_runs(STUDY, tmp_path))
    err = page.fresh["median_abs_error_pct"]
    assert page.fresh["runs"] == 1 and err >= 0 and page.fresh["per_repeat"] == {50: err}
    seeds = page["fresh_seeds"]
    assert seeds[["fresh_run", "seed", "registered"]].values.tolist() == [["fresh_run_5", 50, True]]
    assert "ran with seed 50, registered in the ledger." in sections.seeds_text(page)
    # only Qwen2-0.5B's fresh part ran: the page says whose runs the error is, and which model's wait
    models = {model: model in set(req["model"]) for model in page.fresh["models"] + page.fresh["missing_models"]}
    assert page.fresh["models"] and all(models[m] for m in page.fresh["models"])
    assert page.fresh["missing_models"] and not any(models[m] for m in page.fresh["missing_models"])
    waiting = [m.removeprefix("config:") for m in page.fresh["missing_models"]]
    assert f"the fresh runs of {waiting[0]}" in sections.heldout_text(page)
    assert (
        "1 repeat;" in report._published_from(page)[1]
        and f"{waiting[0]}'s not measured yet" in report._published_from(page)[1]
    )
    # the acceptance check: slower first tokens in the raw CSV move the held-out error
    late = req.assign(first_token_s=req["first_token_s"] + 0.5)
    late.to_csv(d / "fresh_requests.csv", index=False)
    assert report.fresh_error(study_runs(STUDY, tmp_path))["median_abs_error_pct"] > err + 1


def test_an_unregistered_seed_is_named(tmp_path):
    _fresh_run(tmp_path, _one_legacy_run(), seed=53)  # the spec's seeds are 50-52 (three repeats)
    page = report.report(study_runs(STUDY, tmp_path))
    assert page["fresh_seeds"]["registered"].tolist() == [False]
    assert "53 is not" in sections.seeds_text(page)


def test_a_registration_under_an_earlier_freeze_is_void():
    # fresh runs 1-4 (seeds 23, 41-43, 44-46, 47-49) were registered before the freeze of 2026-12-06 06:07
    seeds = report.registered_seeds()
    assert seeds.get("fresh_run_5") == [50, 51, 52]
    assert not {"fresh_run_1", "fresh_run_2", "fresh_run_3", "fresh_run_4"} & set(seeds)


def test_f23_is_combined_over_repeats():
    """F2.3 per repeat, combined: inconclusive below three repeats, the verdict where three agree."""
    from servelab.studies.common.runs import combine
    from servelab.studies.s08_simulator import verdicts

    def table(after: float) -> pd.DataFrame:
        rows = [dict(model="m", gpu_source="Study 2", cost_model=c, subset="validation", error_pct=e)
                for c, e in (("gpu_only", 30.0), ("gpu+overheads", after))]  # fmt: skip
        return pd.DataFrame(rows)

    one = verdicts.f23_finding(table(5.0), "x")
    assert one.verdict == "changes"
    assert combine([[one]])[0].verdict == "inconclusive"
    assert combine([[one]] * 3)[0].verdict == "changes"
    bad = verdicts.f23_finding(table(15.0), "x")  # a raw error above the goal flips that repeat to "fails"
    assert bad.verdict == "fails" and combine([[one], [one], [bad]])[0].verdict == "inconclusive"


def test_the_replicas_needed_search_gives_every_rate_the_same_time_span():
    """A fixed request count gave 8x one replica's rate an eighth of the time, too short for queues to build: the
    page then said 4 replicas serve 8x one replica's load. Each rate's trace now spans the same time."""
    from servelab.loadgen.lengths import ShareGPTLike
    from servelab.studies.s08_simulator.report import SETTINGS, _rate_trace

    lengths = ShareGPTLike(prompt_scale=0.1, output_scale=0.1, prompt_max=64, output_max=16)
    one = 32.0
    spans = {m: _rate_trace(SETTINGS, lengths, one, one * m) for m in (1, 8)}
    assert len(spans[8]) > 6 * len(spans[1])  # about 8x the requests
    assert 0.7 < spans[8].duration_s / spans[1].duration_s < 1.3


def test_the_speed_and_routing_tables_read_with_units_and_a_few_digits(tmp_path):
    _speed_run(tmp_path, 42.002001)
    page = report.report(study_runs(STUDY, tmp_path))
    shown = sections.speed_view(page.speed)["value"]
    assert shown["wall time (s)"] == "42" and shown["requests"] == "360,000" and shown["rate (req/s)"] == "100"
    needed = pd.DataFrame({"rate": [45.254834, 362.038672], "router": "round_robin", "replicas": [1.0, 10.0]})
    cap = sections.capacity_view(needed)
    assert list(cap.index) == ["45.3", "362"] and cap.index.name == "rate (req/s)"
    gain = pd.DataFrame([dict(pool_blocks=871, rate=724.077, affinity_hit_rate=0.866, best_other_hit_rate=0.669,
                              best_other="round_robin", affinity_ttft_p99_ms=47.462, best_other_ttft_p99_ms=148.875,
                              ttft_p99_ratio=0.3188)])  # fmt: skip
    row = sections.affinity_view(gain).iloc[0]
    shown = row[["rate (req/s)", "hit rate, prefix affinity (%)", "p99 TTFT, affinity / that router"]].tolist()
    assert shown == [724, 86.6, 0.32]


def test_f23_says_when_no_fresh_held_out_run_stands_beside_it():
    from servelab.studies.common.findings import Finding

    f = Finding(id="F2.3", claim="c", seed_value="holds", measured_value="19.7", unit="%", verdict="fails", note="n")
    # not "fresh": the findings' Evidence cell says "fresh" of data measured by today's code
    said = report._with_fresh(f, {}).note
    # "the freeze" is the simulator page's word: the findings page, where this note is read too, never defines it
    assert said.endswith("; no run of the real server drawn after the cost model was frozen is committed yet")
    assert "fresh" not in said and "the freeze" not in said
    assert "was not evaluated: no frozen cost model" in report._with_fresh(f, {"error": "no frozen cost model"}).note


def test_f23_not_measured_is_the_seed_claim_read_inconclusive():
    from servelab.studies.s08_simulator.report import f23_not_measured

    f = f23_not_measured("no run")
    assert f.id == "F2.3" and f.verdict == "inconclusive" and "no run" in f.note


def test_the_repeats_of_study_1_are_named_as_its_page_names_them():
    # Study 1's page labels its repeats "repeat k of n"; this note printed their 0-based data ids ("repeat 0")
    from types import SimpleNamespace

    from servelab.studies.common.runs import Run
    from servelab.studies.s01_scheduling.measure import PARTS

    def runs(parts_by_repeat):
        got = [Run(Path(f"r{k}"), {"repeat_index": k, "part": p, "fingerprint": "fp"})
               for k, parts in parts_by_repeat.items() for p in parts]  # fmt: skip
        return RunSet("01_scheduling", tuple(got))

    every = runs({0: PARTS, 1: PARTS, 2: list(PARTS)[:1]})
    whole = runs({0: PARTS, 1: PARTS})
    named = report._study1_names(whole, every)
    r = SimpleNamespace(s1_repeat=named.repeat_name(0), s1_partial=report._partial_repeats(whole, every),
                        f23_models=["qwen2-0.5b"], s1_readings={})  # fmt: skip
    said = report._repeats_note(r, whole, named)
    # the parts by the runs they hold, in the seed's names, not by their ids (qwen-fcfs-chunked2048)
    assert said.startswith("Study 1 has 3 repeats, 2 of them with every part (repeat 3 of 3 lacks qwen2-0.5b's FCFS "
                           "runs and ChunkedPrefill@2048 runs; llama-3-8b's EagerContBatch runs")  # fmt: skip
    assert "qwen-fcfs-chunked2048" not in said and "llama-budget-small" not in said
    assert "checks against repeat 1 of 3, and judges F2.3 on each of repeats 1 and 2 of 3;" in said
    assert said.endswith("F2.3's rule needs 3 repeats, so it reads inconclusive until those runs are measured.")
    # a repeat that lacks only another model's runs: the page says F2.3 does not read them, and what that repeat says
    every = runs({0: PARTS, 1: PARTS, 2: [p for p in PARTS if p != "llama-fcfs-mid"]})
    r.s1_partial = report._partial_repeats(whole, every)
    r.s1_readings = {"repeat 3 of 3": (13.1, "fails")}
    said = report._repeats_note(r, whole, named)
    assert "(repeat 3 of 3 lacks llama-3-8b's FCFS runs at rate fraction 0.7)" in said
    assert "nothing in the fit or the replay pools the models" in said and "takes Study 1's repeats whole" in said
    assert said.endswith("Read on its own, repeat 3 of 3's qwen2-0.5b runs give 13.1 % (fails); that reading is not "
                         "part of the verdict.")  # fmt: skip


def test_the_calibration_table_names_study_2s_fit_in_words_not_by_its_file_stem():
    calib = pd.DataFrame(
        {"model": ["config:qwen2-0.5b", "config:llama-3-8b"],
         "gpu_source": ["Study 2: cost_model_config_qwen2-0.5b_hf_cuda_graph (fitted from its steps) + 1 µs per cached "
                        "token a chunk reads", "step log (calibration runs)"]}
    )  # fmt: skip
    cells = sections.calibration_view(calib)["GPU terms"].tolist()
    assert cells[0] == ("fitted to Study 2's timed steps of config:qwen2-0.5b (hf_cuda_graph mode) + 1 µs per cached "
                        "token a chunk reads")  # fmt: skip
    assert cells[1] == "step log (calibration runs)" and "cost_model_" not in cells[0]


def _f23(repeats: int, verdict: str = "inconclusive"):
    from servelab.studies.common.findings import Finding

    return Finding(id="F2.3", claim="c", seed_value="holds", measured_value="27.26", unit="% median |error|",
                   verdict=verdict, note="n", repeats=repeats, repeat_verdicts=";".join(["fails"] * repeats),
                   spread="19.69–34.83", headline=27.26, headline_unit="%")  # fmt: skip


def test_f23s_note_opens_with_its_error_and_why_it_rests_on_too_few_repeats():
    # the landing table shows a note's first sentence: F2.3's read "Judged from 08_simulator's validation", which
    # said nothing of why the claim is inconclusive
    from types import SimpleNamespace

    from servelab_book.findings_table import one_line

    partial = {"repeat 3 of 3": ["llama-budget-small", "llama-fcfs-mid"]}
    r = SimpleNamespace(s1_partial=partial, f23_models=["qwen2-0.5b"], s1_readings={"repeat 3 of 3": (13.1, "fails")})
    lead = report.f23_lead(_f23(2), r)
    # the parts missing are llama-3-8b's, which F2.3 does not read: the first sentence says so
    assert lead.startswith(
        "The simulator's held-out median |error| is 19.7–34.8 % over 2 repeats (goal ≤ 10 %), inconclusive because "
        "Study 1's repeat 3 of 3 lacks 2 parts, all of them llama-3-8b runs, which F2.3 does not read. "
    )
    assert ("does not read. They are llama-3-8b's budget-sweep runs (ChunkedPrefill@128, ChunkedPrefill@256) and its "
            "FCFS runs at rate fraction 0.7.") in lead  # fmt: skip
    assert "nothing in the fit or the replay pools the models" in lead and "make gpu-plan lists the jobs" in lead
    assert "repeat 3 of 3's qwen2-0.5b runs give 13.1 % (fails); that reading is not part of the verdict" in lead
    # a missing part F2.3 reads: the repeats it rests on, and no claim that the parts do not matter
    r.f23_models = ["llama-3-8b", "qwen2-0.5b"]
    lead = report.f23_lead(_f23(2), r)
    assert one_line(lead).endswith("inconclusive as Study 1's repeat 3 of 3 lacks 2 of its parts.")
    assert "a verdict needs 3" in lead and "pools" not in lead and "13.1" not in lead
    # judged on three repeats, or with no repeat left out, the substance alone
    assert report.f23_lead(_f23(3, "fails"), r) == (
        "The simulator's held-out median |error| is 19.7–34.8 % over 3 repeats (goal ≤ 10 %)."
    )
    assert "inconclusive" not in report.f23_lead(_f23(2), SimpleNamespace(s1_partial={}))


def _validated_page(qwen_after: float, f23=None) -> report.Study8Page:
    rows = [dict(model=m, gpu_source=src, cost_model=c, subset="validation", metric="throughput", error_pct=e)
            for m, src, before, after in (("config:qwen2-0.5b", "Study 2", 49.0, qwen_after),
                                          ("config:llama-3-8b", "step log", 10.0, 2.0))
            for c, e in (("gpu_only", before), ("gpu+overheads", after))]  # fmt: skip
    page = report.Study8Page(RunSet(STUDY), [], source="Study 1's server runs", study1=True)
    page.tables["sim_validation"] = pd.DataFrame(rows)
    page.s1_repeat, page.f23 = "repeat 1 of 3", f23
    page.s1_partial = {"repeat 3 of 3": ["llama-fcfs-mid"]}
    return page


def test_the_fidelity_figures_give_study_2s_costs_first_labelled_with_their_repeat():
    from servelab.studies.s08_simulator import takeaways as tk

    page = _validated_page(19.7, _f23(2))
    short = tk._fidelity_short(page)
    assert short.startswith("Replaying Study 1's server runs (repeat 1 of 3), the simulator's median |error|")
    assert "of qwen2-0.5b, whose GPU costs are Study 2's, is 49.0 % with the GPU cost model alone and 19.7 %" in short
    assert "pooled with llama-3-8b, whose GPU cost model is fitted to Study 1's own step log" in short
    box = tk.fidelity(page)
    assert "(repeat 1 of 3's held-out runs, six metrics; goal ≤ 10 %)\n:class: warning" in box  # a missed goal
    # F2.3's value to the page's one decimal, as its interval and every error beside it (27.26 -> 27.3)
    assert "reads 27.3 % (19.7–34.8 % over 2 repeats): **inconclusive**, as a verdict needs 3 repeats" in box
    assert ":class: tip" in tk.fidelity(_validated_page(8.0, _f23(3, "changes")))


def test_the_published_row_gives_f23s_value_not_one_repeats():
    value, note = report._published_from(_validated_page(19.7, _f23(2)))
    assert value == "27.3 %" and note.startswith("F2.3's value, the median over 2 repeats (19.7–34.8 %) of the ")
    assert "held out from the fit, for qwen2-0.5b, whose GPU costs are Study 2's;" in note


def test_the_speed_says_which_repeat_each_time_is(tmp_path):
    _speed_run(tmp_path, 42.0)
    page = report.report(study_runs(STUDY, tmp_path))
    assert "in the first of its repeats" not in sections.tk.speed(page)  # one repeat: nothing to tell apart
    page.speed.update(repeats=3, hour_wall_s=42.3)
    said = sections.tk.speed(page)
    # the times as the table beside them gives them (three significant figures): 42 and 42.3, not 42.0 and 42
    assert "took 42 s in the first of its repeats" in said and "42.3 s (the median over 3 repeats)" in said


def test_the_gpu_terms_box_says_what_study_7s_steps_make_of_them():
    from servelab.studies.s08_simulator import takeaways as tk

    check = pd.DataFrame(
        [dict(cost_model=c, mode=m, error_pct=e) for c, m, e in (
            ("without the two terms", "uncached", 8.0), ("without the two terms", "cached", 30.0),
            ("with both", "uncached", 16.0), ("with both", "cached", 28.0))]
    )  # fmt: skip
    said = tk._study7_terms(check)
    assert said.startswith("; there they make the step times worse: a median |error| of 19.0 % without them, 22.0 %")
    assert "(uncached 8.0 → 16.0 %; cached 30.0 → 28.0 %)" in said and "keeps both all the same" in said
    assert tk._study7_terms(None) == "."


def test_the_source_words_write_a_long_step_count_with_separators():
    from servelab.studies.s08_simulator.source_words import gpu_source_words

    said = gpu_source_words("config:llama-3-8b", "step log (calibration runs) + serving terms fitted on 38000 steps")
    assert said == "step log (calibration runs) + serving terms fitted on 38,000 steps"
