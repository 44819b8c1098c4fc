"""Study 7's two doors: the measuring path imports nothing that reports, and the reporting path judges F7.1–F7.4 from
raw run files (nothing measured, three repeats, a changed number, a deleted table)."""

from __future__ import annotations

import pytest
from study_run_fixtures import drop, write_runs

from servelab.measure.fingerprint import fingerprint
from servelab.studies.common.runs import study_runs
from servelab.studies.s07_prefix_cache import report

STUDY = "07_prefix_cache"
RAW = ["prefix_length", "multi_turn", "batch_sharing", "policy_hit_rates", "serving_summary", "serving_requests"]


def test_the_measuring_path_imports_nothing_that_reports():
    files = fingerprint("servelab.studies.s07_prefix_cache.measure").files
    banned = ("report", "plots", "verdicts", "derive", "cost_fit", "servelab_book", "common/page", "common/runs",
              "common/study", "common/published", "common/markdown")  # fmt: skip
    assert not [f for f in files if any(b in f for b in banned)]
    assert "lib/servelab/studies/s07_prefix_cache/serving.py" in files


def test_nothing_measured_is_inconclusive_and_empty(tmp_path):
    r = report.report(study_runs(STUDY, tmp_path))
    assert [f.id for f in r.findings] == ["F7.1", "F7.2", "F7.3", "F7.4"]
    assert {f.verdict for f in r.findings} == {"inconclusive"} and r["prefix_length"].empty
    assert report.published_value(r.runs) is None and report.takeaways(r) == ""


def test_three_repeats_of_the_legacy_data_give_the_rules_verdicts(tmp_path):
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW)))
    v = {f.id: f.verdict for f in r.findings}
    assert v == {"F7.1": "changes", "F7.2": "holds", "F7.3": "changes", "F7.4": "holds"}
    assert r.findings[0].measured_value.startswith("1.44× at 512 tokens") and r.findings[0].repeats == 3
    # the published throughput gain's counterpart is the server's (burst, caching on over off), the isolated
    # prefill speedup beside it: the prefill speedup alone stood against a throughput gain
    s = r["serving_summary"].set_index(["load", "caching"])["throughput_tok_s"]
    value, what = report.published_value(r.runs)
    assert value == f"{s[('burst', 'on')] / s[('burst', 'off')]:.2f} ×" and "server output throughput" in what
    assert what.endswith("4.47 × prefill speedup with a cached 8,192-token prefix")
    assert "Serving with prefix caching off → on" in report.takeaways(r)


def test_a_changed_raw_number_changes_the_verdict_and_the_value(tmp_path):
    def edit(name, df):
        if name == "prefix_length":  # the cached request at 512 tokens as fast as the seed's 2.41×
            at = df["prefix_tokens"].eq(512) & df["mode"].eq("cached")
            unc = float(df.loc[df["prefix_tokens"].eq(512) & df["mode"].eq("uncached"), "median_ms"].iloc[0])
            df.loc[at, ["median_ms", "p25_ms", "p75_ms"]] = unc / 2.41
        if name == "policy_hit_rates":
            at = df["policy"].eq("lfu") & df["alpha"].eq(2.0) & df["capacity"].eq(4)
            df.loc[at, "hit_rate"] = 0.5
        return df

    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW, edit=edit)))
    v = {f.id: f for f in r.findings}
    assert v["F7.1"].verdict == "holds" and v["F7.1"].measured_value.startswith("2.41×")
    assert v["F7.4"].verdict == "changes" and v["F7.4"].measured_value == "50.0%"


def test_one_repeat_is_inconclusive_and_a_deleted_table_does_not_crash(tmp_path):
    root = write_runs(tmp_path, STUDY, RAW, repeats=1)
    r = report.report(study_runs(STUDY, root))
    assert {f.verdict for f in r.findings} == {"inconclusive"}
    drop(root, STUDY, "batch_sharing")
    drop(root, STUDY, "serving_summary")
    r = report.report(study_runs(STUDY, root))
    assert [f.id for f in r.findings] == ["F7.1", "F7.2", "F7.3", "F7.4"]
    assert r.findings[2].measured_value == "not measured" and r["batch_sharing_breakeven"].empty
    assert report.serving_sentence(r) == "" and report.published_value(r.runs) is not None


@pytest.mark.parametrize("name", ["prefix_length", "multi_turn", "policy_hit_rates"])
def test_each_missing_sweep_leaves_only_its_claim_unjudged(tmp_path, name):
    root = write_runs(tmp_path, STUDY, [n for n in RAW if n != name])
    r = report.report(study_runs(STUDY, root))
    missing = [f.id for f in r.findings if f.measured_value == "not measured"]
    assert missing == [{"prefix_length": "F7.1", "multi_turn": "F7.2", "policy_hit_rates": "F7.4"}[name]]


def test_the_speedup_tables_show_the_statistic_the_headlines_take():
    # 2026-12-04: the prefix-length table divided the pooled TTFTs (1.50x at 512 tokens) beside F7.1's headline,
    # the median of the repeats' speedups (1.42x); each point is now that median, as the headline is
    from servelab.paths import DATA_DIR

    r = report.report(study_runs(STUDY, DATA_DIR / "results"))
    if len(r.runs.repeats) < 3:
        pytest.skip("fewer than three repeats committed")
    f71 = next(f for f in r.findings if f.id == "F7.1")
    at = r["prefix_length_speedup"].set_index("prefix_tokens").loc[512, "speedup"]
    assert f"{at:.2f}×" == f"{f71.headline:.2f}×"


def test_a_server_run_one_repeat_skipped_is_pooled_over_the_repeats_that_ran_it(tmp_path):
    # the H200's repeat 0 skipped its burst runs (time budget): the pooled row took that repeat's status, "skipped",
    # with n_repeats 3 beside the medians of the other two, and the page said only "Some server runs did not complete"
    def skip_burst(name, df):
        if name == "serving_summary" and skip_burst.calls == 0:
            burst = df["load"].eq("burst")
            df.loc[burst, "status"] = "skipped: time budget"
            df.loc[burst, [c for c in df.columns if c.endswith("_ms")]] = float("nan")
        skip_burst.calls += name == "serving_summary"
        return df

    skip_burst.calls = 0
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW, edit=skip_burst)))
    s = r["serving_summary"].set_index(["load", "caching"])
    assert list(s.index) == [("poisson", "off"), ("poisson", "on"), ("burst", "off"), ("burst", "on")]
    assert (s["status"] == "ok").all() and s.loc[("burst", "on"), "n_repeats"] == 2
    said = report.serving_sentence(r)  # the burst medians are over the 2 repeats that ran it, and say so
    assert s.loc[("poisson", "on"), "n_repeats"] == 3 and "poisson (over" not in said
    assert "burst (over 2 of the 3 repeats, the ones that ran it):" in said
    gaps = report.serving_gaps(r)
    assert "burst, caching off: 2 of 3 repeats ran it (repeat 1 of 3: skipped: time budget)" in gaps
    assert "poisson" not in gaps and "repeats" in report.serving_view(r).columns
    every = report.report(study_runs(STUDY, write_runs(tmp_path / "all", STUDY, RAW)))
    assert report.serving_gaps(every) == ""


def test_the_serving_table_rounds_to_what_the_runs_resolve(tmp_path):
    # "2019.596" tokens/s and "1137.666" ms read as more precise than the runs are
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW)))
    v = report.serving_view(r)
    assert "output tokens/s" in v and not v["output tokens/s"].str.contains(r"\.").any()
    assert v["TTFT p50 (ms)"].str.fullmatch(r"[\d,]+\.\d").all() and "ideal hit rate (%)" in v
    # and long numbers carry thousands separators, as the prose beside them does ("1137.7" read in the table)
    assert v["output tokens/s"].str.contains(",").any()


def test_the_prefix_length_table_says_each_column_is_its_own_median(tmp_path):
    # 2026-12: its row read 4.19 | 2.80 | 1.42, three medians from three repeats, with nothing saying so
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW)))
    assert "Each column is its own median over the 3 repeats" in report.prefix_length_caption(r)
    v = report.prefix_length_view(r)
    assert v.columns[0] == "prefix (tokens)" and "8,192" in v["prefix (tokens)"].tolist()
    fit = report.cost_fit_view(r["batch_sharing_cost_fit"], per="request")
    assert {"slope (ms per request)", "r²", "prefix (tokens)"} <= set(fit.columns)
    one = report.report(study_runs(STUDY, write_runs(tmp_path / "one", STUDY, RAW, repeats=1)))
    assert report.prefix_length_caption(one) == ""


def test_f73_gives_each_repeats_breakeven_and_medians_of_each_repeats_ratio(tmp_path):
    # 2026-12 audit: F7.3 read "[repeat 1 of 3] n=4 at 128" while the repeats broke even at n = 4, 2 and 4 at 128
    # tokens, the length that decides; and its "median over repeats" ratios were ratios of the median times (3.11×
    # at 512 tokens, n = 32, where the repeats' own ratios were 3.42, 2.73 and 3.20)
    from servelab.studies.s07_prefix_cache.derive import breakeven

    scale = {0: (1.0, 1.0), 1: (2.0, 3.0), 2: (3.0, 1.5)}  # (independent, shared) at 512 tokens, n = 32, by repeat

    def edit(name, df):
        if name != "batch_sharing":
            return df
        k, edit.calls = edit.calls, edit.calls + 1
        at = df["prefix_tokens"].eq(512) & df["n"].eq(32)
        for sharing, x in zip(("independent", "shared"), scale[k], strict=True):
            df.loc[at & df["sharing"].eq(sharing), "median_ms"] *= x
        if k == 1:  # the second repeat's sharing is slower at n = 2, 128 tokens: it breaks even only from n = 4
            two = df["prefix_tokens"].eq(128) & df["n"].eq(2)
            shared = float(df.loc[two & df["sharing"].eq("shared"), "median_ms"].iloc[0])
            df.loc[two & df["sharing"].eq("independent"), "median_ms"] = 0.9 * shared
        edited.append(df.copy())
        return df

    edit.calls, edited = 0, []
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW, edit=edit)))
    f73 = next(f for f in r.findings if f.id == "F7.3")
    each = [breakeven(df).set_index("prefix_tokens")["breakeven_n"] for df in edited]
    assert [int(b[128]) for b in each] == [2, 4, 2] and f73.verdict == "changes"
    assert f73.measured_value == "n=2, 4, 2 at 128; n=2, 2, 2 at 512; n=2, 2, 2 at 2,048 (in repeats 1, 2 and 3)"
    view = report.batch_sharing_view(r).set_index("prefix (tokens)")
    assert view.loc["128", "each repeat's breakeven n"] == "2, 4, 2"
    # the ratio at 512 tokens and n = 32: the median of the repeats' own, not the ratio of the median times
    own = sorted(breakeven(df).set_index("prefix_tokens").loc[512, "ratio_at_max_n"] for df in edited)
    be = r["batch_sharing_breakeven"].set_index("prefix_tokens")
    assert be.loc[512, "ratio_at_max_n"] == pytest.approx(own[1])
    pooled = r["batch_sharing"].pivot_table(index=["prefix_tokens", "n"], columns="sharing", values="median_ms")
    assert pooled.loc[(512, 32), "independent"] / pooled.loc[(512, 32), "shared"] != pytest.approx(own[1])
    assert "median over repeats of a repeat's own ratio" in f73.note and f"n=32: {own[1]:.2f}×" in f73.note
    assert "median over the 3 repeats of each repeat's own" in report.batch_sharing_caption(r)


def test_f74_and_the_policy_table_name_the_policies_as_the_page_defines_them(tmp_path):
    r = report.report(study_runs(STUDY, write_runs(tmp_path, STUDY, RAW)))
    f74 = next(f for f in r.findings if f.id == "F7.4")
    assert "lfu_perfect" not in f74.note and "belady" not in f74.note
    assert "perfect LFU" in f74.note and "Belady's MIN" in f74.note
    cols = list(report.policies_view(r).columns)
    assert "perfect LFU" in cols and "radix (blocks)" in cols and "lfu_perfect" not in cols
