"""Study 6's two doors: the measuring path's import closure, and the reporting path on synthetic run folders, on the
committed legacy run and on nothing measured (CPU, files only)."""

import json

import numpy as np
import pandas as pd
import pytest

from servelab.measure.fingerprint import fingerprint
from servelab.paths import DATA_DIR
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s03_speculative.plots import REAL_ALPHA_COLUMNS
from servelab.studies.s06_hf_assisted import report

STUDY = "06_hf_assisted"
LENGTHS = [32, 128, 512]
# pair -> (draft, target, cost ratio c, speedup at 512); the speedup grows with length and falls with c
PAIRS = {"d1 → T": ("d1", "T", 0.2, 1.75), "d2 → T": ("d2", "T", 0.4, 1.4), "d1 → d2": ("d1", "d2", 0.6, 1.1)}
LENGTH_FACTOR = {32: 0.8, 128: 0.9, 512: 1.0}
MS_PER_TOKEN = {"T": 10.0, "d2": 4.0, "d1": 2.0}


def _run_tables(n_prompts: int, speedup_scale: float = 1.0) -> dict[str, pd.DataFrame]:
    runs, times, alpha = [], [], []
    for p in range(n_prompts):
        for model, ms in MS_PER_TOKEN.items():
            runs.append(dict(prompt=p, method="plain", target=model, draft="", pair=model, status="ok",
                             ms_per_token_median=ms, ms_per_token_p25=ms, ms_per_token_p75=ms,
                             tokens_per_step=1.0))  # fmt: skip
            for k in LENGTHS:
                times.append(dict(prompt=p, method="plain", target=model, draft="", pair=model, length=k, ms=ms * k))
        for name, (d, t, _c, s) in PAIRS.items():
            runs.append(dict(prompt=p, method="assisted", target=t, draft=d, pair=name, status="ok",
                             ms_per_token_median=np.nan, ms_per_token_p25=np.nan, ms_per_token_p75=np.nan,
                             tokens_per_step=2.0))  # fmt: skip
            for k in LENGTHS:
                speed = s * LENGTH_FACTOR[k] * (speedup_scale if name == "d1 → T" else 1.0) * (1 + 0.001 * p)
                times.append(dict(prompt=p, method="assisted", target=t, draft=d, pair=name, length=k,
                                  ms=MS_PER_TOKEN[t] * k / speed))  # fmt: skip
            alpha.append(dict(prompt=p, pair=name, draft=d, target=t, tokens=64, alpha=0.6))
    models = pd.DataFrame(
        [dict(model=m, params=int(ms * 1e7), layers=int(ms), weight_bytes=int(ms * 2e7)) for m, ms in
         MS_PER_TOKEN.items()]
    ).assign(tested_on="T (100M, 10 layers) with drafts d1, d2; synthetic")  # fmt: skip
    hits = pd.DataFrame(
        [dict(draft=d, target="T", kind="distilled", prompt=p, positions=8, kept=(p + i) % 9 if i else 4,
              hits="1" * ((p + i) % 9 if i else 4) + "0" * (8 - ((p + i) % 9 if i else 4)))
         for p in range(n_prompts) for i, d in enumerate(["d1", "d2"])]
    )  # fmt: skip
    return dict(runs=pd.DataFrame(runs), times=pd.DataFrame(times), alpha=pd.DataFrame(alpha), models=models,
                alpha_hits=hits)  # fmt: skip


def _write(root, n_prompts=9, repeats=3, speedup_scale=1.0, fp="abc123abc123"):
    for r in range(repeats):
        d = root / "nvidia-h200" / STUDY / "runs" / fp / "all" / f"r{r}"
        d.mkdir(parents=True, exist_ok=True)
        for name, df in _run_tables(n_prompts, speedup_scale).items():
            df.to_csv(d / f"{name}.csv", index=False)
        meta = dict(study=STUDY, fingerprint=fp, part="all", repeat_index=r, complete=True, seed=r,
                    written_utc=f"2027-01-01T00:00:0{r}", device={"name": "NVIDIA H200"},
                    params=dict(profile="full", n_prompts=n_prompts, lengths=LENGTHS, dtype="bfloat16",
                                own_gamma=4))  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta))
    return study_runs(STUDY, root)


def _verdicts(page) -> dict[str, str]:
    return {f.id: f.verdict for f in page.findings}


def test_measuring_path_imports_no_reporting_module():
    files = fingerprint(f"servelab.studies.s{STUDY}.measure").files
    bad = [f for f in files if any(k in f for k in ("plots", "report", "verdicts", "servelab_book", "/page.py",
                                                     "common/runs.py", "common/study.py", "published"))]  # fmt: skip
    assert "lib/servelab/studies/s06_hf_assisted/measure.py" in files and not bad


def test_nothing_measured_is_inconclusive_and_renders(tmp_path):
    page = report.report(RunSet(STUDY))
    assert [f.id for f in page.findings] == ["F6.1", "F6.2"]
    assert set(_verdicts(page).values()) == {"inconclusive"}
    assert page.speedups.empty and report.speedup_view(page).empty and report.published_value(page.runs) is None
    assert report.real_alpha(page.runs).empty and "No published" not in report.published(page)
    assert report.takeaways(page)


def test_synthetic_runs_give_the_rules_verdicts_and_a_changed_number_changes_them(tmp_path):
    page = report.report(_write(tmp_path / "a"))
    assert _verdicts(page) == {"F6.1": "holds", "F6.2": "holds"}
    f61 = page.findings[0]
    assert f61.headline == pytest.approx(1.75, rel=0.01) and "d1 → T" in f61.note
    value, what = report.published_value(page.runs)
    assert float(value.split()[0]) == pytest.approx(1.75, rel=0.01) and "d1 → T" in what and "512" in what
    # the acceptance check: one number in the raw times moves the verdict and the value
    changed = report.report(_write(tmp_path / "b", speedup_scale=2.0))
    assert _verdicts(changed)["F6.1"] == "changes"
    assert float(report.published_value(changed.runs)[0].split()[0]) == pytest.approx(3.5, rel=0.01)


def test_fewer_than_eight_prompts_per_point_is_inconclusive_with_the_reason(tmp_path):
    page = report.report(_write(tmp_path, n_prompts=3))
    assert _verdicts(page) == {"F6.1": "inconclusive", "F6.2": "inconclusive"}
    assert all("at most 3 prompts per point, below the 8" in f.note for f in page.findings)
    assert "1 repeat" not in page.findings[0].note  # three repeats: the prompts are the reason
    assert "below the 8" in report.published_value(page.runs)[1]


def test_fewer_than_three_repeats_is_inconclusive(tmp_path):
    page = report.report(_write(tmp_path, repeats=2))
    assert set(_verdicts(page).values()) == {"inconclusive"}
    assert all("2 repeats" in f.note for f in page.findings)


def test_real_alpha_has_study3s_columns_and_follows_the_hits(tmp_path):
    runs = _write(tmp_path, n_prompts=9)
    a = report.real_alpha(runs)
    assert set(REAL_ALPHA_COLUMNS) <= set(a.columns) and list(a["pair"]) == ["d1 → T", "d2 → T"]
    # d1's hits are 11110000: α counts the positions a draft can propose, all but the first (the target's prefill
    # emits it), so 3 of 7
    assert a.loc[0, "alpha"] == pytest.approx(3 / 7) and a.loc[0, "prompts"] == 27  # 3 repeats × 9 prompts
    assert a.loc[0, "ci_low"] <= a.loc[0, "alpha"] <= a.loc[0, "ci_high"]
    assert report.real_alpha(runs).equals(a)  # the interval is a function of the data
    d = next(runs.runs[0].dir.glob("alpha_hits.csv"))
    h = pd.read_csv(d, dtype={"hits": str})
    h.loc[h["draft"] == "d1", "hits"] = "11111111"
    h.to_csv(d, index=False)
    assert report.real_alpha(runs).loc[0, "alpha"] > a.loc[0, "alpha"]


def test_a_missing_table_does_not_crash_the_page(tmp_path):
    runs = _write(tmp_path)
    for r in runs.runs:
        (r.dir / "times.csv").unlink()
    page = report.report(runs)
    assert set(_verdicts(page).values()) == {"inconclusive"} and page.speedups.empty
    assert report.published_value(runs) is None and report.takeaways(page)


def test_the_committed_legacy_run_reads_inconclusive_by_todays_rules():
    root = DATA_DIR / "results"
    if not (root / "nvidia-h200" / STUDY / "runs" / "legacy").is_dir():
        pytest.skip("no committed legacy run")
    page = report.report(study_runs(STUDY, root).at("legacy"))
    assert page.legacy and _verdicts(page) == {"F6.1": "inconclusive", "F6.2": "inconclusive"}
    assert all("at most 3 prompts per point, below the 8" in f.note for f in page.findings)
    assert "target-124m" in page.tested_on and "draft-6m" in page.tested_on


def test_the_output_against_plain_greedy_is_shown_per_method_and_pair():
    page = report.report(RunSet(STUDY))
    assert report.match_view(page).startswith("No run recorded")
    page.match_rates = pd.DataFrame(
        {"method": ["assisted", "own"], "pair": ["d → T", "d → T"], "runs": [3.0, 2.0],
         "exact_match_rate": [1 / 3, 0.5], "matching_prefix_mean": [0.09, 0.5]}
    )  # fmt: skip
    v = report.match_view(page)
    assert v["equal to plain (% of runs)"].tolist() == [33.3, 50.0] and v["runs"].tolist() == [3, 2]
    assert v["tokens before the first difference (mean %)"].tolist() == [9.0, 50.0]


def test_the_coverage_view_counts_each_length_over_the_pairs_measured_there():
    # a draft's own plain runs stop at the cost length: a minimum over every pair read 0 plain prompts at 512
    # tokens beside the target's 9
    from types import SimpleNamespace

    nan = float("nan")  # no repeat measured the pair at that length
    cov = pd.DataFrame(
        {"method": ["plain", "plain", "own_plain"], "pair": ["t", "d", "t"], "64": [9.0, 9.0, nan],
         "512": [9.0, nan, 8.0], "n_repeats": [1, 1, 1]}
    )  # fmt: skip
    out = report.coverage_view(SimpleNamespace(coverage=cov)).set_index("method")
    plain, alone = "plain HF generate", "servelab engine, target alone"  # the methods as the speedup table names them
    assert out.loc[plain, "512 tok"] == 9 and out.loc[plain, "pairs"] == 2
    assert out.loc[alone, "64 tok"] == 0 and out.loc[alone, "512 tok"] == 8


def test_the_coverage_counts_the_fewest_prompts_a_repeat_measured_as_the_speedup_table_does():
    # the median over repeats of 8, 9 and 7 read 8 beside the speedup table's 7 (fewest in a repeat)
    from types import SimpleNamespace

    def repeat(lookup: int, d: int) -> pd.DataFrame:
        return pd.DataFrame({"method": ["prompt_lookup", "plain"], "pair": ["t", "d"], 64: [9, 0], 512: [lookup, d]})

    cov = report._pool_coverage([repeat(8, 9), repeat(9, 0), repeat(7, 9)]).set_index(["method", "pair"])
    assert cov.loc[("prompt_lookup", "t"), 512] == 7 and cov.loc[("prompt_lookup", "t"), "n_repeats"] == 3
    # a repeat that measured none where the others did counts as 0; a pair no repeat measured there is not a count
    assert cov.loc[("plain", "d"), 512] == 0 and pd.isna(cov.loc[("plain", "d"), 64])
    out = report.coverage_view(SimpleNamespace(coverage=cov.reset_index())).set_index("method")
    assert out.loc["prompt lookup", "512 tok"] == 7 and out.loc["plain HF generate", "512 tok"] == 0
    caption = report.coverage_caption(SimpleNamespace(min_prompts=8))
    assert "the fewest any repeat measured" in caption and "prompts (fewest in a repeat)" in caption
    assert "at least 8 of that repeat's prompts" in caption


def test_the_takeaways_name_each_baseline_and_each_repeats_prompts():
    speed = pd.DataFrame({"method": ["own", "prompt_lookup"], "pair": ["d → T", "T"], "length": [512, 512],
                          "speedup_median": [0.9, 2.0], "prompts": [8, 7], "prompts_by_repeat": ["8, 9, 8", "8, 9, 7"],
                          "n_repeats": [3, 3]})  # fmt: skip
    own = report.speed_sentence(speed, "own", 8)
    assert "the servelab engine running the target alone" in own and "8, 9 and 8 prompts" in own
    lookup = report.speed_sentence(speed, "prompt_lookup", 8)
    assert "plain HF generate" in lookup and "one repeat had fewer than the 8 prompts" in lookup


def test_the_match_rates_pool_every_repeats_runs():
    # medians over repeats of the runs (9) and of the rate (1/8) read "9 runs, 12.5%"
    frames = [pd.DataFrame({"method": ["assisted"], "pair": ["d → T"], "runs": [n], "exact_match_rate": [k / n],
                            "matching_prefix_mean": [0.2]}) for n, k in ((9, 2), (9, 1), (8, 1))]  # fmt: skip
    m = report._pool_matches(frames)
    assert m["runs"].item() == 26 and m["exact_match_rate"].item() == pytest.approx(4 / 26)


def test_the_seed_shapes_name_their_weights():
    from servelab.studies.s06_hf_assisted.verdicts import seed_shapes

    costs = pd.DataFrame({"pair": ["a → b"], "draft": ["config:a"], "target": ["config:b"]})
    assert seed_shapes(costs) == "cost at the seed's shapes: a → b (architecture-exact, random weights; HF generate)"


def test_the_engines_speedup_says_it_is_not_the_ratio_of_the_tables_rows():
    # 2026-12: "0.89× the servelab engine running the target alone" stood beside the table's rows over plain HF
    # generate, 17.96× and 18.38×, whose ratio is 0.98: each is its own median over prompts, the 0.89 the median of
    # each prompt's ratio
    from types import SimpleNamespace

    own = pd.DataFrame({"method": ["own"], "pair": ["d → T"], "target": ["T"], "length": [512],
                        "speedup_median": [0.89], "prompts": [8], "prompts_by_repeat": ["8"],
                        "n_repeats": [1]})  # fmt: skip
    hf = pd.DataFrame({"method": ["own", "own_plain"], "pair": ["d → T", "T"], "length": [512, 512],
                       "speedup_median": [18.0, 18.4]})  # fmt: skip
    said = report.own_sentence(SimpleNamespace(own_vs_engine=own, speedups=hf, min_prompts=8))
    assert "0.89× the servelab engine running the target alone" in said
    assert "not the ratio of the table's two rows over plain HF generate (18.00× and 18.40×" in said
    assert f"{18.0 / 18.4:.2f})." in said


def test_the_runs_left_out_are_counted_with_their_reasons_and_the_deep_drafts_loss_is_explained():
    from types import SimpleNamespace

    runs = pd.DataFrame({"status": ["ok", "skipped", "skipped", "cut"],
                         "error": [None, "would not fit the wall-time budget: needs ≈16 s, 6 s left",
                                   "would not fit the wall-time budget: needs ≈8 s, 2 s left",
                                   "stopped at the wall-time budget after 458 of 512 tokens"]})  # fmt: skip
    page = SimpleNamespace(runs=SimpleNamespace(measured=True, table=lambda name: runs))
    said = report.left_out(page)
    assert "Of the 4 timed runs over every repeat, 2 skipped and 1 cut short did not complete" in said
    assert "would not fit the wall-time budget (2); stopped at the wall-time budget (1)" in said
    distill = pd.DataFrame({"draft": ["d2", "d6"], "last_loss": [2.0, 0.02], "tokens_seen": [7e6, 7e6],
                            "tokens": [175_000, 175_000]})  # fmt: skip
    alpha = pd.DataFrame({"draft": ["d2", "d6"], "alpha": [0.42, 0.40]})
    caption = report.distill_caption(SimpleNamespace(distill=distill, real_alpha=alpha))
    assert "d6 saw 7.0 million tokens, about 40 passes" in caption and "(α 0.40 against 0.42)" in caption
    better = alpha.assign(alpha=[0.40, 0.42])  # the low loss went with the higher α: nothing to explain
    assert "memorised" not in report.distill_caption(SimpleNamespace(distill=distill, real_alpha=better))


def test_the_seed_shapes_costs_are_the_median_over_repeats_with_an_implausible_repeat_named(tmp_path):
    # the audit: the notes quoted one repeat's c = 1.15 for qwen2-0.5b -> qwen2-1.5b (a draft slower than its target,
    # the repeat of the median speedup) where the other repeats read 0.86, and predicted 0.63× from it
    _write(tmp_path)
    for r, (draft_ms, target_ms) in enumerate([(30.18, 26.35), (17.66, 20.58), (13.62, 15.84)]):
        pd.DataFrame(
            [dict(pair="q5 → q15", draft="config:q5", target="config:q15", draft_ms=draft_ms, target_ms=target_ms,
                  c=draft_ms / target_ms, params_ratio=0.32, tokens=64, repeats=3)]
        ).to_csv(tmp_path / "nvidia-h200" / STUDY / "runs" / "abc123abc123" / "all" / f"r{r}" / "seed_costs.csv",
                 index=False)  # fmt: skip
    page = report.report(study_runs(STUDY, tmp_path))
    assert _verdicts(page) == {"F6.1": "holds", "F6.2": "holds"}  # no rule reads the seed shapes' costs
    c = float(np.median([30.18 / 26.35, 17.66 / 20.58, 13.62 / 15.84]))
    f61, f62 = page.findings
    assert f"each c the median over 3 repeats, α = 0.60 from the real pair): q5 → q15: c = {c:.2f} " in f61.note
    assert "(repeats 1.15 / 0.86 / 0.86)" in f61.note and "c = 1.15," not in f61.note
    assert "repeat 1 of 3's c = 1.15 (draft step 30.18 ms, target 26.35 ms) has a draft with 0.32× the target's" in (
        f61.note
    )
    assert f"q5 → q15 {c:.2f} (repeats 1.15 / 0.86 / 0.86, one not physically plausible: see F6.1's note)" in f62.note
    assert page.seed_costs["c"].iloc[0] == pytest.approx(c)


def test_f62s_note_says_which_pair_has_a_draft_as_its_target(tmp_path):
    # the audit: a draft -> draft pair stood among F6.2's "3 pairs" with no word of why
    f62 = report.report(_write(tmp_path)).findings[1]
    assert (
        "one of the 3 pairs, d1 → d2, has a draft serving as the target (the smallest draft drafting for the largest): "
        "the one real target with its 2 drafts gives 2 cost ratios, and the rule ranks pairs by c only where at least "
        "3 reached one length" in f62.note
    )
