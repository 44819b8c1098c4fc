"""Repeats of a claim combine into one finding: median, an order-statistic interval, and "inconclusive" on
disagreement; the book shows the fourth badge with each repeat's verdict and the spread."""

from __future__ import annotations

import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.measure.results import findings_frame
from servelab.studies.common.findings import Finding
from servelab.studies.common.repeats import combine_repeats, median_interval
from servelab_book.findings_table import (
    BADGES,
    INCONCLUSIVE,
    NOT_MEASURED,
    _badge,
    h200_value,
    render_summary,
    verdict_counts,
)


def rep(value, verdict, claim="F5.1", unit="×", **kw):
    return Finding(
        id=claim,
        claim="sdpa vs naive",
        seed_value="7.64",
        measured_value=str(value),
        unit=unit,
        verdict=verdict,
        note="ratio at 2,048 tokens.",
        **kw,
    )


def test_the_headline_is_the_median_and_interval_where_every_repeat_has_one():
    """Text measured values with a headline each: the median and interval are the headlines', the text is kept."""
    text = "qwen: 150.8 → 24.7 ms; median cut 70%"
    reps = [rep(text, "holds", headline=h, headline_unit="% cut") for h in (70.0, 55.0, 62.0)]
    f = combine_repeats(reps)
    assert f.headline == 62.0 and f.headline_unit == "% cut" and f.spread == "55–70"
    assert f.measured_value == text and "median 62 % cut, 55–70 % over 3 repeats" in f.note
    numbers = combine_repeats([rep(v, "holds", headline=2 * v, headline_unit="%") for v in (1.0, 3.0, 2.0)])
    assert numbers.measured_value == "2" and numbers.headline == 4.0 and numbers.spread == "2–6"
    partial = combine_repeats(
        [rep(1.0, "holds", headline=9.0, headline_unit="%"), rep(2.0, "holds"), rep(3.0, "holds")]
    )
    assert partial.headline is None and partial.spread == "1–3"  # one repeat without: the measured values decide
    row = findings_frame([f.row()]).iloc[0]
    assert row["headline"] == 62.0 and row["headline_unit"] == "% cut"
    old = findings_frame([{k: v for k, v in rep(1.0, "holds").row().items() if not k.startswith("headline")}])
    assert old.iloc[0]["headline"] == "" and old.iloc[0]["headline_unit"] == ""  # an older findings.csv still loads


def test_a_headline_is_a_finite_number_with_a_unit():
    assert rep(1, "holds", headline="", headline_unit="").headline is None  # an empty findings.csv cell
    assert rep(1, "holds", headline=float("nan"), headline_unit="%").headline is None  # nothing measured
    assert rep(1, "holds", headline="1.5", headline_unit="%").headline == 1.5
    for bad, message in ((float("inf"), "finite"), ("many", "a number"), (True, "a number")):
        with pytest.raises(ValueError, match=message):
            rep(1, "holds", headline=bad, headline_unit="%")
    with pytest.raises(ValueError, match="headline_unit"):
        rep(1, "holds", headline=2.0)


def test_three_repeats_give_the_median_and_the_min_max_said_as_such():
    f = combine_repeats([rep(8.1, "holds"), rep(5.33, "holds"), rep(6.0, "holds")])
    assert f.verdict == "holds" and f.repeats == 3 and f.repeat_verdicts == "holds;holds;holds"
    assert f.measured_value == "6" and f.spread == "5.33–8.1"
    assert "min–max: a 75% interval for the median" in f.note and f.note.startswith("ratio at 2,048 tokens.")


def test_an_interval_reads_unambiguously_when_its_bounds_are_equal_or_negative():
    # the book printed "-1–-1" (F6.2's ρ, equal in every repeat) and "2–2" (F7.3's break-even count)
    same = combine_repeats([rep(2, "changes") for _ in range(3)])
    assert same.spread == "all 2" and "2 × in each of the 3 repeats" in same.note and "min–max" not in same.note
    rho = combine_repeats([rep(v, "changes") for v in (-1.0, -0.5, -0.7)])
    assert rho.spread == "-1 to -0.5" and "-1 to -0.5 × over 3 repeats" in rho.note
    assert combine_repeats([rep(v, "holds") for v in (1.0, 3.0, 2.0)]).spread == "1–3"


def test_the_note_gives_the_interval_in_its_unit_and_the_rule_apart():
    # F7.1's note read "median 1.421 × TTFT speedup at a 512-token prefix (holds within ±25% of 2.41)" under a
    # verdict of changes, as if the value held
    unit = "× TTFT speedup at a 512-token prefix (holds within ±25% of 2.41)"
    f = combine_repeats([rep(v, "changes", headline=v, headline_unit=unit) for v in (1.42, 1.41, 1.55)])
    assert "median 1.42 × TTFT speedup at a 512-token prefix, 1.41–1.55 × over 3 repeats" in f.note
    assert "; the rule: holds within ±25% of 2.41" in f.note and "prefix (holds" not in f.note
    assert f.headline_unit == unit  # the tables shorten it themselves


def test_a_unit_that_says_what_the_number_is_gives_its_qualifier_once():
    # F2.1 read "median 6.534 µs/token, prefill at ≥ 4096 tokens, median over 2 models, 6.29–6.595 µs/token,
    # prefill at ≥ 4096 tokens, median over 2 models over 3 repeats"
    unit = "µs/token, prefill at ≥ 4096 tokens, median over 2 models"
    f = combine_repeats([rep(v, "changes", headline=v, headline_unit=unit) for v in (6.29, 6.534, 6.595)])
    said = "median 6.534 µs/token (prefill at ≥ 4096 tokens, median over 2 models), 6.29–6.595 µs/token over 3 repeats"
    assert said in f.note and f.note.count("median over 2 models") == 1
    same = combine_repeats([rep(2, "changes", headline=2, headline_unit=unit) for _ in range(3)])
    assert "2 µs/token (prefill at ≥ 4096 tokens, median over 2 models) in each of the 3 repeats" in same.note


def test_disagreeing_repeats_are_inconclusive_and_say_who_said_what():
    f = combine_repeats([rep(1.05, "changes"), rep(0.97, "holds"), rep(0.99, "holds")])
    assert f.verdict == INCONCLUSIVE and f.repeat_verdicts == "changes;holds;holds"
    assert "the 3 repeats say changes; holds; holds" in f.note
    row = findings_frame([f.row()]).iloc[0]
    assert row["verdict"] == INCONCLUSIVE and row["repeats"] == 3 and row["spread"] == "0.97–1.05"


def test_interval_coverage_is_exact_and_reaches_95_from_six_repeats():
    assert median_interval([3, 1, 2]).coverage == pytest.approx(0.75)
    assert median_interval([1, 2, 3, 4, 5]).coverage == pytest.approx(1 - 2 / 32)
    six = median_interval([6, 1, 5, 2, 4, 3])
    assert (six.low, six.high, six.median) == (1, 6, 3.5) and six.coverage == pytest.approx(1 - 2 / 64)
    twenty = median_interval(list(range(20)))  # k=6: 1 - 2 P(Bin(20, .5) <= 5) = 0.9586
    assert (twenty.low, twenty.high) == (5, 14) and twenty.coverage == pytest.approx(0.958611, abs=1e-6)
    assert not twenty.is_min_max and median_interval([1, 2, 3]).is_min_max


def test_text_values_need_numbers_unless_all_repeats_agree():
    same = combine_repeats([rep("kernel", "holds", unit="")] * 3)
    assert same.measured_value == "kernel" and same.spread == ""
    pair = [rep("21923–47819", "holds"), rep("21000–47000", "holds"), rep("22000–48000", "holds")]
    with pytest.raises(ParameterError, match="pass values="):
        combine_repeats(pair)
    # four significant digits, never scientific notation, with the thousands separator the book writes
    assert combine_repeats(pair, values=[47819, 47000, 48000]).measured_value == "47,820"


@pytest.mark.parametrize(
    "repeats, message",
    [
        ([rep(1, "holds"), rep(2, "holds")], "at least 3"),
        ([rep(1, "holds"), rep(2, "holds"), rep(3, "holds", claim="F5.2")], "one claim"),
        ([rep(1, "holds"), rep(2, "holds"), rep(3, "holds", unit="ms")], "one unit"),
    ],
)
def test_bad_repeats_are_refused(repeats, message):
    with pytest.raises(ParameterError, match=message):
        combine_repeats(repeats)


def test_a_combined_finding_is_not_a_repeat():
    combined = combine_repeats([rep(1, "holds")] * 3)
    with pytest.raises(ParameterError, match="not a combined finding"):
        combine_repeats([combined] * 3)


def test_a_claim_judged_per_model_shows_each_models_interval_not_the_median_over_models():
    """F1.1 read "changes" beside an interval of -361% to 69%: the median over two models, whose verdicts stand on
    their own numbers. Its interval is each model's now, and the median over models leaves the note."""
    unit = "% cut, median over rates; median over 2 models"
    cuts = [(92.0, -818.0), (95.4, 44.7), (91.6, 30.8)]
    reps = [
        rep("t", "changes", headline=(a + b) / 2, headline_unit=unit, headline_parts=(("big", a), ("small", b)))
        for a, b in cuts
    ]
    c = combine_repeats(reps)
    assert c.verdict == "changes" and c.spread == "per model: big 91.6–95.4; small -818 to 44.7"
    assert "big median 92 % cut (median over rates), 91.6–95.4 % over 3 repeats" in c.note
    assert "-363" not in c.note and "61.75" not in c.note  # the median over models' interval and median are gone
    assert h200_value("t", "%", c.spread, 3, c.headline_unit) == (
        "t (3 repeats, per model: big 91.6–95.4 %; small -818 to 44.7 % cut, median over rates)"
    )
    # one model: its headline is its own, and the interval is the headline's as before
    one = combine_repeats([rep("t", "changes", headline=a, headline_unit="% cut", headline_parts=(("big", a),))
                           for a, _ in cuts])  # fmt: skip
    assert one.spread == "91.6–95.4"
    assert "headline_parts" not in c.row()  # no findings.csv column: the spread carries it


def test_the_book_shows_the_fourth_badge_with_the_spread():
    assert INCONCLUSIVE in BADGES
    badge = _badge(INCONCLUSIVE, "holds;holds;changes")
    assert badge == "{bdg-info}`inconclusive` (holds, holds, changes)"
    assert _badge("holds", "holds;holds;holds") == "{bdg-success}`holds`"
    assert h200_value("1.0034", "×", "0.97–1.05", "3") == "1 × (3 repeats: 0.97–1.05)"
    # a worded value carries its units; the interval is of the headline, in its own unit
    assert h200_value("1.42× at 512 tokens", "× TTFT", "1.4–1.5", 3, "× (median)") == (
        "1.42× at 512 tokens (3 repeats: 1.4–1.5 ×)"
    )
    assert h200_value("5.33", "×") == "5.33 ×"
    table = pd.DataFrame(
        {
            "verdict": ["holds", INCONCLUSIVE, INCONCLUSIVE],
            "h200_value": ["1 ×", "2 ×", NOT_MEASURED],
            "freshness": ["fresh", "stale", "no data"],
        }
    )
    assert verdict_counts(table) == {
        "holds": 1,
        "changes": 0,
        "fails": 0,
        INCONCLUSIVE: 2,
        NOT_MEASURED: 1,
        "stale": 1,
    }
    summary = render_summary(table)
    assert "2 have H200 data: 1 holds, 0 change and 0 fail" in summary
    assert "; 1 is inconclusive (too few repeats, or repeats that disagree)" in summary  # the thin one
    assert "; 1 is not measured yet (inconclusive)" in summary  # no data is inconclusive, never "fails"
    assert "1 rests on data measured by older code (stale)" in summary


def test_the_text_of_a_claim_is_the_median_repeats():
    from servelab.studies.common.findings import Finding
    from servelab.studies.common.repeats import combine_repeats

    def f(text, h):
        return Finding(
            id="F3.3", claim="c", seed_value="1", measured_value=text, unit="×", verdict="holds", note=f"n {text}",
            headline=h, headline_unit="× ratio",
        )  # fmt: skip

    got = combine_repeats([f("eager 1.22×", 0.39), f("eager 0.67×", 0.21), f("eager 1.37×", 0.44)])
    assert got.headline == 0.39 and got.measured_value == "eager 1.22×" and got.note.startswith("n eager 1.22×")


def test_the_evidence_cell_says_when_the_value_rests_on_fewer_repeats_than_judged_the_claim():
    from types import SimpleNamespace

    from servelab_book.findings_table import evidence_text

    def row(repeats, said):
        return SimpleNamespace(
            h200_value="ρ = -1", freshness="fresh", repeats=repeats, repeat_verdicts=said, spread="all -1",
            tested_on="random weights; SmolLM2-135M",
        )  # fmt: skip

    thin = evidence_text(row(2, "changes;changes;inconclusive"))  # the third repeat ran, too thin for its rule
    assert thin.startswith("2 of 3 repeats measured it; interval all -1")
    assert evidence_text(row(2, "fails;fails;missing")).startswith("2 repeats;")  # a missing one did not run it
    assert evidence_text(row(3, "holds;holds;holds")).startswith("3 repeats;")


def test_the_evidence_cell_gives_the_intervals_unit_and_the_banner_every_run():
    from types import SimpleNamespace

    from servelab_book.findings_table import _runs_text, evidence_text

    row = SimpleNamespace(
        h200_value="6.4", freshness="fresh", repeats=3, repeat_verdicts="holds;holds;holds", spread="6.29–6.595",
        tested_on="random weights", headline_unit="µs/token (prefill at ≥ 4096 tokens): holds within 30–70",
    )  # fmt: skip
    assert evidence_text(row).startswith("3 repeats; interval 6.29–6.595 µs/token;")
    runs = SimpleNamespace(
        runs=28, first_started_utc="2026-12-04T05:45:00+00:00", last_started_utc="2026-12-06T06:07:46+00:00",
        commits="493e2b2, 50ec960", started_utc="2026-12-04T05:45:00+00:00", git_commit="493e2b2aaaaaaaa",
    )  # fmt: skip
    said = _runs_text(runs)
    assert said.startswith("28 runs started 2026-12-04 05:45 UTC to 2026-12-06 06:07 UTC")
    assert said.endswith("commits `493e2b2`, `50ec960`")
    one = SimpleNamespace(**{**vars(runs), "runs": 1})
    assert _runs_text(one) == "run started 2026-12-04 05:45 UTC, commit `493e2b2aaaaa`"


def test_a_value_labelled_with_its_repeat_keeps_its_unit():
    from servelab.studies.common.findings import Finding
    from servelab.studies.common.page import finding_sentence
    from servelab_book.findings_table import h200_value

    f = Finding(
        id="F6.1", claim="assisted generation pays", seed_value="1", measured_value="[repeat 1 of 3] 0.75",
        unit="× at 512 tokens", verdict="holds", note="n",
    )  # fmt: skip
    assert finding_sentence(f).endswith(": [repeat 1 of 3] 0.75 × at 512 tokens.")
    assert h200_value("[repeat 1 of 3] 0.75", "×").startswith("[repeat 1 of 3] 0.75 ×")


def test_an_interval_is_shown_with_separators_and_each_models_unit():
    from servelab.studies.common.repeats import spread_with_unit

    assert spread_with_unit("1880–1882", "GB/s") == "1,880–1,882 GB/s"
    assert spread_with_unit("per model: a 91.5–95.4; b 1200–1500", "ms, median") == (
        "per model: a 91.5–95.4 ms; b 1,200–1,500 ms, median"
    )
    assert spread_with_unit("2–3", "") == "2–3"
