"""Study 2's reporting path from files only: nothing measured, three synthetic repeats, a changed number, and the
measuring path's fingerprint free of reporting code."""

import json

import matplotlib
import pandas as pd
import pytest

from servelab.measure.fingerprint import fingerprint
from servelab.paths import DATA_DIR
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s02_gpu_costs import plots, report

matplotlib.use("Agg")

STUDY = "02_gpu_costs"
DEVICE = {"name": "Test H200", "slug": "nvidia-h200", "kind": "cuda"}
# the ceilings as a run records them (``Ceilings.as_dict``), from the committed legacy run
CEILINGS = json.loads((DATA_DIR / "results/nvidia-h200/02_gpu_costs/runs/legacy/all/r0/run.json").read_text())[
    "ceilings"
]


def _row(mode, phase, batch, new_tokens, context, ms, floor_ms, **kw):
    tokens = batch * new_tokens + kw.get("decodes", 0)
    return dict(
        model="config:qwen2-0.5b",
        mode=mode,
        phase=phase,
        batch=batch,
        new_tokens=new_tokens,
        context=context,
        decodes=kw.get("decodes", 0),
        decode_context=kw.get("decode_context", 0),
        path="",
        flops=2e9 * tokens,
        bytes=1e9 + 1e4 * batch * context,
        status="ok",
        median_ms=ms,
        p25_ms=ms * 0.98,
        p75_ms=ms * 1.02,
        us_per_token=ms * 1e3 / tokens,
        floor_ms=floor_ms,
        pct_of_floor=100 * floor_ms / ms,
        achieved_tflop_s=2e9 * tokens / (ms * 1e-3) / 1e12,
    )


def synthetic_steps(prefill_us: float = 3.0, decode_ms: float = 10.0) -> pd.DataFrame:
    """Two modes with prefills, decodes (four contexts, three batches); decode ``decode_ms`` at batch 1 and a floor
    of 0.3 ms (launch-bound: F2.2 fails), prefill ``prefill_us`` µs/token at long prompts."""
    rows = []
    for mode in ("hf_eager", "hf_cuda_graph"):
        for n in (128, 512, 1024, 4096, 8192):
            us = prefill_us * (1 + 512 / n)
            rows.append(_row(mode, "prefill", 1, n, 0, us * n / 1e3, n * 2e9 * 2 / 800e12 * 1e3))
        for b in (1, 16, 64):
            for c in (128, 512, 2048, 8192):
                ms = decode_ms * (1 + b * c / 1e6)
                rows.append(_row(mode, "decode", b, 1, c, ms, 0.3 * (1 + b * c / 1e6)))
    return pd.DataFrame(rows)


def write_runs(root, steps_per_repeat, fp="f" * 64):
    """``root/nvidia-h200/02_gpu_costs/runs/<fp>/all/r<k>/`` with ``steps.csv`` and a complete ``run.json``."""
    for k, steps in enumerate(steps_per_repeat):
        d = root / "nvidia-h200" / STUDY / "runs" / fp[:12] / "all" / f"r{k}"
        d.mkdir(parents=True)
        steps.to_csv(d / "steps.csv", index=False)
        meta = dict(
            study=STUDY, fingerprint=fp, part="all", repeat_index=k, seed=k, complete=True, device=DEVICE,
            ceilings=CEILINGS, params={"dtype": "bfloat16"}, written_utc=f"2026-01-0{k + 1}T00:00:00+00:00",
        )  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta))
    return study_runs(STUDY, root)


def by_id(page):
    return {f.id: f for f in page.findings}


def test_nothing_measured_gives_inconclusive_findings_and_empty_tables(tmp_path):
    page = report.report(study_runs(STUDY, tmp_path))
    assert page.findings and {f.verdict for f in page.findings} == {"inconclusive"}
    assert {f.id for f in page.findings} == {"F2.1", "F2.2", "F2.3"}
    assert page.steps.empty and page.cost_fit.empty
    assert report.published_value(page.runs) is None
    assert "not measured" in report.takeaways(page)  # the page's text renders, no crash
    assert report.published(page)
    empty = report.report(RunSet(STUDY))
    assert {f.verdict for f in empty.findings} == {"inconclusive"}


def test_three_synthetic_repeats_give_the_rules_verdicts(tmp_path):
    runs = write_runs(tmp_path, [synthetic_steps() for _ in range(3)])
    assert runs.repeats == [0, 1, 2]
    page = report.report(runs)
    f = by_id(page)
    assert f["F2.1"].verdict == "changes"  # 3.x µs/token: far below the seed's 30–70
    assert f["F2.2"].verdict == "fails"  # 3% of a memory floor: launch-bound
    assert f["F2.1"].repeats == 3 and f["F2.1"].headline == pytest.approx(
        3.0 * (2 + 512 / 4096 + 512 / 8192) / 2
    )  # median of 4,096 and 8,192
    assert not page.steps.empty and (page.steps["n_repeats"] == 3).all()
    assert not page.modes.empty
    for fig in (
        plots.prefill_cost(page.steps, page.device),
        plots.decode_single(page.steps, page.device),
        plots.decode_cost(page.steps, "config:qwen2-0.5b", page.device),
        plots.pct_of_floor(page.steps, "config:qwen2-0.5b", page.device),
        plots.roofline(page.steps, page.ceilings, page.device),
    ):
        assert fig.get_size_inches()[0] <= 8.0
        labels = [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
        matplotlib.pyplot.close(fig)
        if labels and "µs/token" in "".join(labels):
            assert any(lab.startswith("RTX 2070 (seed)") for lab in labels)


def test_changing_a_number_in_the_raw_csv_changes_the_verdict(tmp_path):
    seedlike = synthetic_steps(prefill_us=45.0)  # 45 × (1 + 1/8) ≈ 51 µs/token at 4,096 tokens: inside 30–70
    page = report.report(write_runs(tmp_path, [seedlike] * 3))
    assert by_id(page)["F2.1"].verdict == "holds"
    other = tmp_path / "other"
    page2 = report.report(write_runs(other, [synthetic_steps(prefill_us=3.0)] * 3))
    assert by_id(page2)["F2.1"].verdict == "changes"
    # one repeat disagreeing: the combined verdict is inconclusive
    mixed = tmp_path / "mixed"
    page3 = report.report(write_runs(mixed, [seedlike, seedlike, synthetic_steps(prefill_us=3.0)]))
    assert by_id(page3)["F2.1"].verdict == "inconclusive"


def test_fewer_than_three_repeats_is_inconclusive(tmp_path):
    page = report.report(write_runs(tmp_path, [synthetic_steps()]))
    assert {f.verdict for f in page.findings} == {"inconclusive"}
    assert "a verdict needs 3" in page.findings[0].note


def test_a_missing_csv_does_not_crash_the_page(tmp_path):
    runs = write_runs(tmp_path, [synthetic_steps()] * 3)
    for r in runs.runs:
        (r.dir / "steps.csv").unlink()
    page = report.report(runs)
    assert page.steps.empty and {f.verdict for f in page.findings} == {"inconclusive"}
    assert "not measured (no step of this study was timed in its runs)" in report.takeaways(page)  # it says why


def test_measuring_fingerprint_has_no_reporting_module():
    files = fingerprint(f"servelab.studies.s{STUDY}.measure").files
    assert any(p.endswith("s02_gpu_costs/measure.py") for p in files)
    banned = ("report.py", "plots.py", "verdicts.py", "servelab_book/", "common/page.py", "common/runs.py",
              "common/study.py", "common/campaign.py", "common/published.py", "common/markdown.py")  # fmt: skip
    assert not [p for p in files if p.endswith(banned) or "servelab_book/" in p]


def test_the_page_sets_its_uncompiled_engine_beside_the_benchmarks_default(tmp_path):
    # Study 2 times the engine without torch.compile (2.16 ms at batch 1, context 128 on the H200) while the engine
    # page's benchmark, in the default the servers run, timed 0.96 ms: the page said nothing of the difference
    steps = pd.concat([synthetic_steps(), synthetic_steps().assign(mode="engine")], ignore_index=True)
    runs = write_runs(tmp_path, [steps] * 3)
    assert report.report(runs).bench_decode.empty and "torch.compile" not in report.takeaways(report.report(runs))
    engine = tmp_path / "nvidia-h200" / "engine"
    engine.mkdir()
    (engine / "run.json").write_text(json.dumps({"params": {"model": "config:qwen2-0.5b"}}))
    pd.DataFrame(
        [
            dict(impl="engine_default", batch=1, context=128, status="ok", median_ms=0.5, note="compile on"),
            dict(impl="engine_gather_eager", batch=1, context=128, status="ok", median_ms=9.0, note=""),
            dict(impl="engine_default", batch=2, context=99, status="ok", median_ms=0.7, note="no such step here"),
        ]
    ).to_csv(engine / "decode.csv", index=False)
    page = report.report(runs)
    line = report.compiled_sentence(page.steps, page.bench_decode)
    ours = page.steps.query("mode == 'engine' and phase == 'decode' and batch == 1 and context == 128").median_ms
    assert f"batch 1, context 128: {ours.iloc[0]:.2f} ms here, 0.50 ms there" in line
    assert "9.00" not in line and "context 99" not in line and line in report.takeaways(page)


def test_f22s_words_are_each_steps_median_over_repeats_as_the_tables_beside_them(tmp_path):
    # HF eager's decode moves far more between repeats than the rule's number: one repeat's range read against the
    # modes table (medians over repeats) contradicted it
    runs = write_runs(tmp_path, [synthetic_steps(decode_ms=ms) for ms in (10.0, 20.0, 40.0)])
    page = report.report(runs)
    f = by_id(page)["F2.2"]
    assert f.verdict == "fails" and "20,0" in f.measured_value and "10,0" not in f.measured_value
    assert "each step's median over the 3 repeats" in f.measured_value and "[from repeat" not in f.note
    assert f.note.endswith("]") and "over 3 repeats" in f.note  # the interval over repeats stays
    assert "lowest in hf_cuda_graph mode" in f.headline_unit  # the rule's number is the fastest mode's


def test_study_2_says_f23_is_judged_on_study_1s_runs_and_whether_a_fresh_run_stands_beside_it(tmp_path):
    said = report.f23_elsewhere(tmp_path)
    assert "against Study 1's server runs held out from its fit, not yet on a fresh held-out run" in said
