"""Study 3's two doors: the measuring path's import closure holds no reporting module; the report reads runs only,
survives an empty run set and missing tables, and its verdicts follow the raw rows."""

import dataclasses
import json

import pandas as pd

from servelab.measure.fingerprint import fingerprint
from servelab.paths import DATA_DIR
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s03_speculative import report

STUDY = "03_speculative"


def test_measuring_closure_holds_no_reporting_module():
    files = fingerprint("servelab.studies.s03_speculative.measure").files
    bad = ("plots", "report", "verdicts", "s03_speculative/tables.py", "measured_alpha", "/page.py", "/runs.py",
           "/study.py", "campaign", "published", "markdown", "servelab_book")  # fmt: skip
    assert "lib/servelab/studies/s03_speculative/measure.py" in files  # a closure to look in, not an empty one
    assert not [f for f in files if any(b in f for b in bad)]


def test_nothing_measured_is_inconclusive_and_does_not_crash():
    page = report.report(RunSet(STUDY))
    assert page.findings and all(f.verdict == "inconclusive" for f in page.findings)
    assert page.speedup.empty and page.controlled.empty
    assert report.published_value(page.runs) is None
    assert report.takeaways(page)


def _shape_steps(eager_ratio: float) -> pd.DataFrame:
    """Step costs of the seed's shapes: the target takes ``eager_ratio`` × the draft's time in eager mode."""
    rows = []
    for model, params, eager_ms, engine_ms in (("qwen2-0.5b", 5e8, 1.0, 0.2), ("qwen2-1.5b", 1.5e9, eager_ratio, 0.6)):
        for mode, ms in (("hf_eager", eager_ms), ("engine", engine_ms)):
            rows.append(dict(model=model, params=params, weight_bytes=2 * params, mode=mode, status="ok",
                             median_ms=ms, p25_ms=ms, p75_ms=ms, floor_ms=ms / 10))  # fmt: skip
    return pd.DataFrame(rows)


def _write_run(root, k: int, eager_ratio: float):
    d = root / "nvidia-h200" / STUDY / "runs" / "fp" / "costs" / f"r{k}"
    d.mkdir(parents=True)
    params = {"shape_pairs": [["config:qwen2-0.5b", "config:qwen2-1.5b"]], "dtype": "bfloat16"}
    meta = {"complete": True, "fingerprint": "fp", "part": "costs", "repeat_index": k, "params": params}
    (d / "run.json").write_text(json.dumps(meta))
    _shape_steps(eager_ratio).to_csv(d / "shape_steps.csv", index=False)
    return d


def _f33(root):
    page = report.report(study_runs(STUDY, root))
    return next(f for f in page.findings if f.id == "F3.3"), page


def test_verdict_follows_the_raw_rows(tmp_path):
    dirs = [_write_run(tmp_path, k, 1.1) for k in range(3)]  # eager 1.1× against 3× parameters, engine 3×
    f, page = _f33(tmp_path)
    assert f.verdict == "holds", f
    assert "qwen2-1.5b" in f.tested_on and "random weights" in f.tested_on
    assert len(page.cost_ratios) == 2 and page.controlled.empty
    # the acceptance check: one number in a raw CSV changes the verdict (eager no longer far below parameters)
    for d in dirs:
        s = pd.read_csv(d / "shape_steps.csv")
        s.loc[(s.model == "qwen2-1.5b") & (s["mode"] == "hf_eager"), ["median_ms", "p25_ms", "p75_ms"]] = 2.9
        s.to_csv(d / "shape_steps.csv", index=False)
    f2, _ = _f33(tmp_path)
    assert f2.verdict == "changes", f2


def test_fewer_than_three_repeats_is_inconclusive_and_missing_tables_do_not_crash(tmp_path):
    _write_run(tmp_path, 0, 1.1)
    f, page = _f33(tmp_path)
    assert f.verdict == "inconclusive"
    assert page.speedup.empty and page.lookup.empty and page.real_alpha.empty  # parts never measured


def test_legacy_runs_are_read_and_recomputed():
    # the committed legacy runs (the tests' scratch root has none), read alone as a stale page would read them
    runs = study_runs(STUDY, DATA_DIR / "results")
    legacy = sorted((r for r in (*runs.runs, *runs.older) if r.fingerprint == "legacy"), key=lambda r: r.part)
    page = report.report(dataclasses.replace(runs, runs=tuple(legacy)))
    assert page.runs.measured and set(page.runs.parts) >= {"all", "controlled"}
    assert len(page.controlled) > 100 and len(page.speedup) > 10  # recomputed from raw rows, not findings.csv
    assert all(f.verdict == "inconclusive" for f in page.findings)  # one repeat


def test_the_pays_table_says_where_no_alpha_pays():
    import pandas as pd

    from servelab.studies.s03_speculative.report import pays_view

    pays = pd.DataFrame(
        {"draft": ["d", "d"], "target": ["t", "t"], "batch": [1, 32], "alpha_pays": [0.6, float("nan")],
         "alpha_max": [0.9, 0.9], "best_speedup": [1.5, 0.8], "c": [0.3, 0.6]}
    )  # fmt: skip
    shown = pays_view(pays)["pays above α"].tolist()
    assert shown == [0.6, "not up to 0.90"]
    # the lowest α set already paying read "pays above α 0.5"; and a row resting on one repeat did not say so
    every = pays.assign(all_pay=[True, False], alpha_pays=[0.5, float("nan")], n_repeats=[1, 3])
    view = pays_view(every)
    assert view["pays above α"].tolist() == ["every α measured, from 0.50", "not up to 0.90"]
    assert view["repeats"].tolist() == [1, 3]


def test_where_a_pair_pays_agrees_with_its_best_speedup_on_the_committed_runs():
    # 2026-12-04: each column was pooled over repeats on its own, so distilgpt2 -> gpt2-medium at batch 32 read
    # "pays above α 0.877" beside a best speedup of 0.99x (one repeat of three paid); both now come from one
    # pooled curve, each point's median over repeats
    page = report.report(study_runs(STUDY, DATA_DIR / "results"))
    pays = page.controlled_pays
    if pays.empty:
        import pytest

        pytest.skip("no controlled runs committed")
    assert ((pays.best_speedup > 1) == pays.alpha_pays.notna()).all(), pays
    # the audit: F3.1 and F3.3 each quoted another repeat's "where the seed pair pays", beside the table's median
    seed = report.seed_shapes_sentence(pays)
    notes = {f.id: f.note for f in page.findings}
    assert seed and seed in notes["F3.1"] and seed in notes["F3.3"] and seed in report.takeaways(page)
    shown = report.pays_view(pays)
    assert shown["prompts" if "prompts" in shown else "batch"].dtype.kind == "i"  # counts read as integers
    # the audit: F3.3's interval (eager over parameters) agreed in every repeat while the repeats split on the rule's
    # second condition, which nothing showed
    assert "every repeat meets the first condition, so the second is what split them" in notes["F3.3"]
    # the audit: "can differ in the second decimal" stood where F3.1's interval and the table's differed in the first
    best = report.speedup_view(page.speedup).iloc[0]
    quoted = page.quoted_repeat
    assert quoted.startswith("F3.1 quotes repeat ") and quoted in report.takeaways(page)
    assert f"read CI {best['CI low']:.2f}–{best['CI high']:.2f} at its best γ" in quoted


def _write_eager(root, k: int, draft_ms: float, target_ms: float):
    """A costs run whose eager steps take ``draft_ms`` and ``target_ms`` (the engine's stay 0.2 and 0.6 ms)."""
    d = _write_run(root, k, target_ms)
    s = pd.read_csv(d / "shape_steps.csv")
    s.loc[(s.model == "qwen2-0.5b") & (s["mode"] == "hf_eager"), ["median_ms", "p25_ms", "p75_ms"]] = draft_ms
    s.to_csv(d / "shape_steps.csv", index=False)


def test_cost_ratio_rows_show_the_times_of_the_median_repeat(tmp_path):
    # 2026-12-07 audit: each time column was its own median over repeats (24.5 and 22.0 ms beside a ratio of 1.22)
    # ratios 2.5, 0.67, 3.0: the median's repeat is the first; each column's own median (2.0, 2.5 ms) gives 1.25
    for k, (d, t) in enumerate([(1.0, 2.5), (3.0, 2.0), (2.0, 6.0)]):
        _write_eager(tmp_path, k, d, t)
    f, page = _f33(tmp_path)
    view = report.ratios_view(page.cost_ratios)
    ratio = view["target/draft (×), median of repeats"]
    assert (view["target (ms), that repeat"] / view["draft (ms), that repeat"]).round(3).tolist() == ratio.tolist()
    eager = view[view["mode"] == "hf_eager"].iloc[0]
    assert eager["the median's repeat"] == "repeat 1 of 3" and eager["draft (ms), that repeat"] == 1.0
    # the repeat whose target steps faster than its draft is named, here and in F3.3's note, and kept in the rule
    assert page.eager_outliers.startswith("Repeat 2 of 3's eager ratio, 0.67× (qwen2-1.5b step 2.00 ms")
    assert page.eager_outliers in report.ratios_note(page) and page.eager_outliers in f.note
    assert f.repeat_verdicts == "changes;holds;changes" and f.verdict == "inconclusive"
    assert "that repeat says holds; the other repeats say changes, so this repeat alone makes F3.3" in f.note
    # the rule's second condition, per repeat: the best mode over the eager ratio (engine 3.0× here)
    assert (
        "The best mode's ratio over the eager one was 1.20× in repeat 1 of 3 (engine 3.00× over eager 2.50×), 4.50×"
        in f.note
    )
    assert "so the second is what split them" not in f.note  # repeats 1 and 3 are not far below the parameters


def test_a_plausible_eager_ratio_is_not_flagged(tmp_path):
    for k in range(3):
        _write_eager(tmp_path, k, 1.0, 1.2)
    f, page = _f33(tmp_path)
    assert page.eager_outliers == "" and "not physically plausible" not in f.note
    assert "not physically plausible" not in report.ratios_note(page)


def test_loop_audit_names_the_points_whose_rounds_synced_more():
    ctl = pd.DataFrame(
        {"draft": ["d", "d"], "target": ["t", "t"], "batch": [1, 8], "gamma": [2, 2], "alpha": [0.8, 0.8],
         "host_syncs_per_round": [2, 1], "agreement": [1.0, 0.5]}
    )  # fmt: skip
    text = report.loop_audit(ctl)
    assert "at most 1 time, except 2 times for d → t at batch 1;" in text
    assert "a median 75% of sequence-rounds per point (lowest 50%: d → t at batch 8, γ = 2, α = 0.8)" in text
    assert "at most 1 time at every pair" in report.loop_audit(ctl.assign(host_syncs_per_round=1))
    assert report.loop_audit(ctl.iloc[:0]) == ""
