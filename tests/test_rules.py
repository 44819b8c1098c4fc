"""The rule registry: every claim's rule registered with its date, changes after the first H200 run listed with
the old rule's verdict on today's data, and a rule edited without a change entry caught."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.measure.results import VERDICTS
from servelab.paths import REPO_ROOT
from servelab.studies.common.rules import (
    CLAIM_IDS,
    OLD_RULES,
    RuleChange,
    check_registry,
    load_registry,
    old_verdict,
    rule_hash,
)
from servelab.studies.common.runs import Run, RunSet, study_runs
from servelab.studies.common.thresholds import near_threshold, thresholds_near
from servelab.studies.s01_scheduling import verdicts as study1
from servelab.studies.s06_hf_assisted import analysis
from servelab.studies.s06_hf_assisted import verdicts as study6
from servelab_book.rule_changes import reader_why, render_rule_changes

RESULTS = REPO_ROOT / "data" / "results"


@pytest.fixture(scope="module")
def rules():
    return load_registry()


def test_the_committed_registry_is_sound_and_complete(rules):
    assert list(rules) == list(CLAIM_IDS) and len(rules) == 22
    assert check_registry(rules) == []
    for r in rules.values():
        assert (REPO_ROOT / r.implemented_in).is_file(), r.implemented_in


def test_the_changes_the_issue_names_are_registered(rules):
    assert {c for c, r in rules.items() if r.changes} >= {"F1.1", "F1.2", "F2.2", "F2.3", "F4.2", "F6.2"}


def test_this_sessions_study6_changes_are_registered(rules):
    """acd6608 made a (pair, length) speedup count only over ≥ MIN_PROMPTS prompts, with an inconclusive outcome:
    F6.1's first change and F6.2's second, each naming the minimum and the new outcome."""
    for claim, n in (("F6.1", 1), ("F6.2", 2)):
        ch = rules[claim].changes[-1]
        assert len(rules[claim].changes) == n and ch.commit.startswith("acd6608") and ch.date == "2026-12-03"
        assert f"at least {study6.MIN_PROMPTS} prompts" in ch.new_rule and "inconclusive" in ch.new_rule
        assert "inconclusive" not in ch.old_rule and ch.new_rule == rules[claim].rule


def test_a_rule_edited_without_a_change_entry_fails(rules):
    edited = dict(rules, **{"F3.2": replace(rules["F3.2"], rule=rules["F3.2"].rule.replace("20%", "25%"))})
    assert [p for p in check_registry(edited) if p.startswith("F3.2: its rule's text changed")]
    change = RuleChange(
        date="2026-12-04",
        commit="0" * 12,
        old_rule=rules["F3.2"].rule,
        new_rule=edited["F3.2"].rule,
        why="test",
        old_verdict="f62_pairs_table_only",
    )
    fixed = dict(edited, **{"F3.2": replace(edited["F3.2"], changes=(change,))})
    assert check_registry(fixed) == []
    rewrapped = dict(rules, **{"F3.2": replace(rules["F3.2"], rule="  \n".join(rules["F3.2"].rule.split(" ")))})
    assert check_registry(rewrapped) == []  # rewrapping the text is not a change
    wrong_old = dict(fixed, **{"F3.2": replace(fixed["F3.2"], changes=(replace(change, old_rule="x"),))})
    assert any("old rule is not the rule before it" in p for p in check_registry(wrong_old))
    no_fn = dict(fixed, **{"F3.2": replace(fixed["F3.2"], changes=(replace(change, old_verdict="nope"),))})
    assert any("'nope' is not in OLD_RULES" in p for p in check_registry(no_fn))


def test_a_missing_or_unknown_claim_is_reported(rules):
    fewer = {k: v for k, v in rules.items() if k != "F7.4"}
    assert check_registry(fewer) == ["F7.4: no rule registered"]
    assert check_registry(dict(rules, **{"F9.1": replace(rules["F1.1"], id="F9.1")})) == [
        "F9.1: not one of the seed's claims"
    ]


def test_registration_dates_are_their_commits_dates(rules):
    if subprocess.run(["git", "rev-parse"], cwd=REPO_ROOT, capture_output=True).returncode:
        pytest.skip("no git history in this copy (the GPU machine's export): dates cannot be checked here")
    for r in rules.values():
        for commit, day in [(r.registered_commit, r.registered)] + [(c.commit, c.date) for c in r.changes]:
            got = subprocess.run(
                ["git", "log", "-1", "--format=%ad", "--date=short", commit],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert got == day, (r.id, commit)


def one_run(folder) -> RunSet:
    """A flat folder of CSVs (and its run.json, if any) as one repeat's RunSet, as the old rules read it."""
    import json

    side = folder / "run.json"
    meta = {**(json.loads(side.read_text()) if side.is_file() else {}), "complete": True}
    return RunSet(folder.name, (Run(folder, meta),))


def test_old_rules_give_a_verdict_on_todays_data(rules):
    results = {}
    for r in rules.values():
        for ch in r.changes:
            got = old_verdict(r, ch, study_runs(r.study, RESULTS))
            assert got.verdict in VERDICTS and got.detail
            results[r.id] = got.verdict
    assert set(results) == {r.id for r in rules.values() if r.changes}
    assert len({fn for r in rules.values() for fn in (c.old_verdict for c in r.changes)}) <= len(OLD_RULES)


def test_f12s_move_to_the_p99_stall_is_registered_and_its_old_rule_reads_the_committed_verdict(rules, tmp_path):
    """F1.2's stall-cut gate moved from the single maximum to the p99 of per-request maximum ITL (F1.1's statistic):
    the change is registered with the old rule as it was; ``f12_single_max`` gives the committed run's verdict and
    numbers; on a run whose maxima are cut 42% but whose p99s are not cut, the old rule holds and the new one fails."""
    ch = rules["F1.2"].changes[-1]
    assert ch.old_verdict == "f12_single_max" and ch.date == "2026-12-03" and ch.new_rule == rules["F1.2"].rule
    assert "p99" in ch.new_rule and "p99" not in ch.old_rule
    h200 = RESULTS / "nvidia-h200" / "01_scheduling" / "runs" / "legacy" / "all" / "r0"
    old = OLD_RULES["f12_single_max"](one_run(h200))
    committed = pd.read_csv(h200 / "findings.csv").set_index("id").loc["F1.2"]
    assert old.verdict == committed["verdict"] and "×0.52" in old.detail and "×0.52" in committed["measured_value"]
    folder = tmp_path / "01_scheduling"
    folder.mkdir()
    (folder / "run.json").write_text('{"params": {"reference_budget": 512}}')
    rows = [
        dict(model="config:m", scheduler=sch, budget=b, rate=f, rate_fraction=f, sweep="rate", status="ok")
        | dict(max_itl_ms=mx, max_itl_p99_ms=50.0, max_itl_p99_lo_ms=45.0, max_itl_p99_hi_ms=55.0)
        | dict(itl_p99_ms=20.0, mean_ttft_ms=50.0, delivered_tok_s=1000.0 * f, cut=0, requests=200)
        for f in (0.5, 1.0)
        for sch, b, mx in (("eager_cont_batch", 8192, 58.6), ("chunked_prefill", 512, 34.1))
    ]
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    assert OLD_RULES["f12_single_max"](one_run(folder)).verdict == "holds"
    assert study1.f12(pd.read_csv(folder / "summary.csv"), 512).verdict == "fails"


def test_the_old_study6_rule_on_a_synthetic_table(tmp_path):
    """F6.2's old rule on a table where c orders the speedups and length raises them: both decide, holds."""
    folder = tmp_path / "nvidia-h200" / "06_hf_assisted"
    folder.mkdir(parents=True)
    rows = [
        {"pair": p, "cost_ratio": c, "length": n, "speedup_median": base * (1 + 0.1 * i)}
        for p, c, base in (("a", 0.1, 2.0), ("b", 0.3, 1.5), ("c", 0.6, 1.0))
        for i, n in enumerate((32, 64, 128))
    ]
    pd.DataFrame(rows).to_csv(folder / "pairs.csv", index=False)
    got = OLD_RULES["f62_pairs_table_only"](one_run(folder))
    assert got.verdict == "holds" and "ρ_length = +1.00" in got.detail


def _study6_folder(tmp_path, prompts: int):
    """Study 6's pairs.csv and times.csv for three pairs over three lengths and ``prompts`` prompts: c orders the
    speedups (the cheapest draft fastest) and every pair speeds up with the output length."""
    folder = tmp_path / "nvidia-h200" / "06_hf_assisted"
    folder.mkdir(parents=True)
    times, pairs = [], []
    for length in (32, 64, 128):
        for p in range(prompts):
            times.append(dict(prompt=p, method="plain", target="t", draft="", pair="t", length=length, ms=100.0))
    for i, (draft, c) in enumerate((("d1", 0.1), ("d2", 0.3), ("d3", 0.6))):
        for j, length in enumerate((32, 64, 128)):
            speedup = (1.45 - 0.3 * i) * (1 + 0.1 * j)
            for p in range(prompts):
                ms = 100.0 / speedup
                times.append(
                    dict(
                        prompt=p, method="assisted", target="t", draft=draft, pair=f"{draft} → t", length=length, ms=ms
                    )
                )
            pairs.append(
                dict(
                    pair=f"{draft} → t",
                    cost_ratio=c,
                    alpha=0.5,
                    length=length,
                    speedup_median=speedup,
                    speedup_p25=speedup,
                    speedup_p75=speedup,
                    prompts=float(prompts),
                )
            )
    pd.DataFrame(times).to_csv(folder / "times.csv", index=False)
    pd.DataFrame(pairs).to_csv(folder / "pairs.csv", index=False)
    return folder


def test_the_old_study6_rules_count_any_number_of_prompts(tmp_path):
    """On two prompts per point the old rules decide (F6.1 holds at 1.74×, F6.2 holds) where the rule in force,
    which needs MIN_PROMPTS, reads inconclusive; on MIN_PROMPTS prompts both rules agree."""
    few = _study6_folder(tmp_path / "few", prompts=2)
    assert OLD_RULES["f61_any_prompt_count"](one_run(few)).verdict == "holds"
    got = OLD_RULES["f62_any_prompt_count"](one_run(few))
    assert got.verdict == "holds" and "ρ_c = -1.00" in got.detail and "ρ_length = +1.00" in got.detail
    pairs = pd.read_csv(few / "pairs.csv")
    per_prompt = analysis.speedups(pd.read_csv(few / "times.csv"))
    assert [f.verdict for f in study6.findings(pairs, per_prompt)] == ["inconclusive", "inconclusive"]
    enough = _study6_folder(tmp_path / "enough", prompts=study6.MIN_PROMPTS)
    pairs = pd.read_csv(enough / "pairs.csv")
    per_prompt = analysis.speedups(pd.read_csv(enough / "times.csv"))
    now = [f.verdict for f in study6.findings(pairs, per_prompt)]
    assert now == [OLD_RULES[f"f6{k}_any_prompt_count"](one_run(enough)).verdict for k in (1, 2)] == ["holds", "holds"]
    empty = tmp_path / "empty"
    empty.mkdir()
    pd.DataFrame(columns=pairs.columns).to_csv(empty / "pairs.csv", index=False)
    pd.DataFrame(columns=["prompt", "method", "target", "draft", "pair", "length", "ms"]).to_csv(
        empty / "times.csv", index=False
    )
    assert (
        OLD_RULES["f61_any_prompt_count"](one_run(empty)).verdict
        == OLD_RULES["f62_any_prompt_count"](one_run(empty)).verdict
        == "fails"
    )


def test_thresholds_near():
    assert thresholds_near(0.7001, (0.05, 0.20, 0.70), 0.136) == [0.70]
    assert thresholds_near(0.42, (0.05, 0.20, 0.70), 0.02) == []
    assert thresholds_near(0.10, (0.05, 0.20), 0.10) == [0.05, 0.20]
    assert thresholds_near(0.7, (0.70,), float("nan")) == [] and thresholds_near(float("nan"), (0.70,), 0.1) == []


def test_near_threshold():
    assert near_threshold(20.15, 20.0, 0.5) and not near_threshold(25.0, 20.0, 0.5)
    assert near_threshold(0.7001, 0.70, 0.0001 + 1e-12)
    for bad in (float("nan"), "1", True):
        with pytest.raises(ParameterError, match="finite number"):
            near_threshold(bad, 1.0, 0.1)
    with pytest.raises(ParameterError, match="noise must be"):
        near_threshold(1.0, 1.0, -0.1)


def test_the_methodology_section_lists_each_change_with_both_verdicts(rules):
    table = pd.DataFrame({"id": ["F6.2"], "verdict": ["holds"], "reason": ["the report's reason."]})
    md = render_rule_changes(rules, table, RESULTS)
    assert md.count("### F") == sum(len(r.changes) for r in rules.values())
    assert "### F6.2: changed 2026-12-02 (`bbf264c`)" in md and "### F6.2: changed 2026-12-03 (`acd6608`)" in md
    assert "### F6.1: changed 2026-12-03 (`acd6608`)" in md
    section = md.split("### F6.2")[1]
    assert "the old rule says **" in section and "the rule in force says **holds** (the report's reason.)" in section
    # a claim no report judged reads inconclusive with the reason, never a verdict copied from a file
    assert "the rule in force says **inconclusive** (no report judged this claim)" in md.split("### F1.1")[1]
    assert "not yet measured" not in md and "fails: not measured" not in md
    assert rule_hash("a  b\nc") == rule_hash("a b c")
    # a change's reason reads without the tracker's issue number the recorded text opens with
    assert "Why\n: Issue " not in md and "Why\n: A run's single maximum gap is one sample" in md
    assert reader_why("Issue 23: a run's gap.") == "A run's gap." and reader_why("The first run.") == "The first run."


def _study2_runs(tmp_path, repeats: int, variation: float) -> RunSet:
    """Study 2's runs with ``repeats`` repeats of one decode sweep whose HF-eager step varies by ``variation`` over
    context (bandwidth-bound, in the seed's band): F2.2's old rule (HF eager alone) holds where it is flat."""
    import json

    for r in range(repeats):
        d = tmp_path / "nvidia-h200" / "02_gpu_costs" / "runs" / "abc" / "all" / f"r{r}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"complete": True, "fingerprint": "abc", "repeat_index": r}))
        rows = [
            dict(model="config:m", status="ok", phase="decode", mode="hf_eager", batch=1, context=c, median_ms=ms)
            | dict(pct_of_floor=30.0, us_per_token=ms * 1000)
            for c, ms in ((128, 6.0), (4096, 6.0 * (1 + variation)))
        ]
        pd.DataFrame(rows).to_csv(d / "steps.csv", index=False)
    return study_runs("02_gpu_costs", tmp_path)


def test_an_old_rule_is_applied_to_every_repeat_of_the_same_runs(rules, tmp_path):
    """The old rule reads the runs the report reads, repeat by repeat, combined as today's rules are: three flat
    repeats hold; one repeat is too thin (inconclusive, saying why); changing a number in a raw CSV changes it."""
    rule = rules["F2.2"]
    ch = next(c for c in rule.changes if c.old_verdict == "f22_hf_eager_only")
    assert old_verdict(rule, ch, _study2_runs(tmp_path / "a", 3, 0.05)).verdict == "holds"
    thin = old_verdict(rule, ch, _study2_runs(tmp_path / "b", 1, 0.05))
    assert thin.verdict == "inconclusive" and "says holds on 1 repeat, a verdict needs 3" in thin.detail
    assert old_verdict(rule, ch, _study2_runs(tmp_path / "c", 3, 0.50)).verdict == "changes"
    none = old_verdict(rule, ch, study_runs("02_gpu_costs", tmp_path / "empty"))
    assert none.verdict == "inconclusive" and "not measured" in none.detail


def test_f33s_text_states_its_bar_and_the_literal_old_reading_asks_none(rules, monkeypatch):
    """F3.3's registered text said another mode must "reach further" with no bar; the verdict has asked 1.25 × the
    eager ratio since registration. The change entry puts the bar in the text, and ``f33_any_mode_above_eager``
    reads the old text literally: a best mode 1.10 × eager's holds there and changes under the bar."""
    from servelab.studies.s03_speculative import report
    from servelab.studies.s03_speculative import verdicts as study3

    ch = rules["F3.3"].changes[-1]
    assert ch.old_verdict == "f33_any_mode_above_eager" and ch.new_rule == rules["F3.3"].rule
    assert f"{study3.FURTHER:g}" in ch.new_rule and f"{study3.FURTHER:g}" not in ch.old_rule
    pair = ("qwen2-0.5b", "qwen2-1.5b")
    ratios = pd.DataFrame(
        [
            dict(draft=pair[0], target=pair[1], mode=m, target_over_draft=x, param_ratio=3.12, c=1 / x)
            for m, x in (("hf_eager", 1.2), ("hf_cuda_graph", 1.32), ("engine", 1.30))
        ]
    )
    monkeypatch.setattr(report, "cost_ratio_table", lambda rep: ratios)
    monkeypatch.setattr(report, "shape_pair", lambda rep: pair)
    old = OLD_RULES["f33_any_mode_above_eager"](None)
    assert old.verdict == "holds" and "eager 1.20×" in old.detail and "1.32×" in old.detail
    assert study3.f33(ratios, pair).verdict == "changes"  # 1.32 < 1.25 × 1.2
    below = ratios.assign(target_over_draft=[1.2, 1.1, 1.0])
    monkeypatch.setattr(report, "cost_ratio_table", lambda rep: below)
    assert OLD_RULES["f33_any_mode_above_eager"](None).verdict == "changes"
