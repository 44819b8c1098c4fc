"""The re-run check (``common.rerun_check``): a study's campaign repeats against a re-run's, each judged alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from servelab.studies.common import rerun_check
from servelab.studies.common.findings import Finding
from servelab.studies.common.repeats import INCONCLUSIVE
from servelab.studies.common.runs import Run, RunSet


def _runs(parts_by_repeat: dict[int, tuple[str, ...]]) -> RunSet:
    runs = tuple(
        Run(Path(f"/nowhere/{p}/r{i}"), {"part": p, "repeat_index": i, "fingerprint": "fp"})
        for i, parts in parts_by_repeat.items()
        for p in parts
    )
    return RunSet("04_kv_cache", runs)


def _finding(claim: str, verdict: str, n: int) -> Finding:
    return Finding(
        id=claim, claim="a claim", seed_value="1", measured_value="2", unit="x", verdict=verdict, note="why", repeats=n
    )


def _report(verdicts: dict[str, dict[int, str]]):
    """A study report whose claims read, per repeat index, the given verdicts; combined as pages combine them:
    one verdict where every repeat agrees, inconclusive otherwise."""

    def report(runs: RunSet):
        out = []
        for claim, by_repeat in verdicts.items():
            said = {by_repeat[i] for i in runs.repeats}
            out.append(_finding(claim, said.pop() if len(said) == 1 else INCONCLUSIVE, len(runs.repeats)))
        return SimpleNamespace(findings=out)

    return report


def test_the_first_three_whole_repeats_are_the_campaign_and_the_rest_the_rerun():
    runs = _runs({0: ("a", "b"), 1: ("a", "b"), 2: ("a",), 3: ("a", "b"), 4: ("a", "b"), 5: ("a", "b"), 6: ("a", "b")})
    assert rerun_check.whole_repeats(runs) == [0, 1, 3, 4, 5, 6]  # repeat 2 lacks part b
    h = rerun_check.halves(runs)
    assert h.campaign.repeats == [0, 1, 3] and h.rerun.repeats == [4, 5, 6]
    assert {r.part for r in h.rerun.runs} == {"a", "b"}


def test_no_rerun_until_it_has_as_many_whole_repeats_as_a_page_needs():
    assert rerun_check.halves(_runs({i: ("all",) for i in range(5)})) is None
    assert rerun_check.compare("04_kv_cache", _runs({i: ("all",) for i in range(5)}), report=_report({})).empty
    assert "no re-run" in rerun_check.summary("04_kv_cache", rerun_check.compare("04_kv_cache", _runs({0: ("all",)})))


def test_a_claim_repeats_when_the_rerun_reads_the_campaigns_verdict_or_the_campaign_was_inconclusive():
    runs = _runs({i: ("all",) for i in range(6)})
    verdicts = {
        "F4.1": dict.fromkeys(range(6), "holds"),  # the same in both halves
        "F4.2": {0: "holds", 1: "changes", 2: "holds", 3: "changes", 4: "changes", 5: "changes"},  # settled later
        "F4.3": {0: "fails", 1: "fails", 2: "fails", 3: "holds", 4: "holds", 5: "holds"},  # moved
    }
    table = rerun_check.compare("04_kv_cache", runs, report=_report(verdicts))
    got = table.set_index("claim")
    assert got.loc["F4.1", ["campaign", "re-run", "page"]].tolist() == ["holds", "holds", "holds"]
    assert got.loc["F4.2", ["campaign", "re-run"]].tolist() == [INCONCLUSIVE, "changes"]
    assert got.loc["F4.3", ["campaign", "re-run", "page"]].tolist() == ["fails", "holds", INCONCLUSIVE]
    assert got["consistent"].tolist() == [True, True, False]
    assert got.loc["F4.1", "repeats"] == "repeats 1, 2 and 3 of 6 against repeats 4, 5 and 6 of 6"
    text = rerun_check.summary("04_kv_cache", table)
    assert (
        "1 of 3 claims" in text
        and "it settles 1 claim the campaign left inconclusive" in text
        and "F4.3 (fails → holds)" in text
    )


def test_the_page_verdicts_are_taken_from_the_caller_where_it_has_them():
    runs = _runs({i: ("all",) for i in range(6)})
    table = rerun_check.compare(
        "04_kv_cache", runs, report=_report({"F4.1": dict.fromkeys(range(6), "holds")}), page={"F4.1": "changes"}
    )
    assert table["page"].tolist() == ["changes"]


def test_the_methodology_include_shows_each_rerun_studys_table(monkeypatch):
    import pandas as pd

    from servelab.studies.common import runs as runs_mod
    from servelab_book import rerun_check as page

    table = pd.DataFrame(
        dict(
            claim=["F4.1", "F4.3"],
            campaign=["holds", "fails"],
            **{"re-run": ["holds", "holds"]},
            page=["holds", INCONCLUSIVE],
            repeats=["repeats 1, 2 and 3 of 6 against repeats 4, 5 and 6 of 6"] * 2,
            consistent=[True, False],
        )
    )
    monkeypatch.setattr(rerun_check, "compare", lambda slug, runs, page=None: table)
    monkeypatch.setattr(runs_mod, "study_runs", lambda *a, **k: None)
    ev = SimpleNamespace(measured=True, current=True, repeats=6, findings=())
    text = page.render_rerun_check({"04_kv_cache": ev})
    assert "Study 4, KV cache costs" in text and "servelab-rerun" in text
    assert "F4.3 (fails → holds)" in text and "**no**" in text
    assert "No study has been re-run" not in text


def test_without_a_rerun_the_include_says_so_and_prices_the_cheapest(monkeypatch):
    from servelab.studies.common import campaign
    from servelab_book import rerun_check as page

    jobs = [campaign.Job("04_kv_cache", "all", r, 1.5, "recorded") for r in (3, 4, 5)]
    monkeypatch.setattr(campaign, "rerun_jobs", lambda root=None: jobs)
    ev = SimpleNamespace(measured=True, current=True, repeats=3, findings=())
    text = page.render_rerun_check({"04_kv_cache": ev})
    assert text.startswith("No study has been re-run yet")
    assert "Study 4" in text and "3 jobs, about 4.5 min" in text and "STUDIES=04_kv_cache" in text


def test_the_plan_takes_the_cheapest_rerun_among_complete_campaigns_and_none_once_one_exists(monkeypatch):
    from servelab.studies.common import campaign

    stores = {
        "04_kv_cache": _runs({i: ("all",) for i in range(3)}),
        "05_attention": _runs({i: ("all",) for i in range(3)}),
        "07_prefix_cache": _runs({i: ("all",) for i in range(2)}),  # its campaign is not complete: no re-run yet
    }
    minutes = {"04_kv_cache": 2.0, "05_attention": 1.5, "07_prefix_cache": 0.1}

    def runs_of(study, root=None):
        rs = stores.get(study, _runs({}))
        return replace(rs, study=study, today=SimpleNamespace(digest="fp"))

    def missing(study, repeats, root=None, runs=None):
        have = set(runs.repeats)
        return [campaign.Job(study, "all", r, minutes[study], "recorded") for r in range(repeats) if r not in have]

    monkeypatch.setattr(campaign, "study_runs", runs_of)
    monkeypatch.setattr(campaign, "missing_jobs", missing)
    got = campaign.rerun_jobs()
    assert [j.name for j in got] == ["05_attention:all:3", "05_attention:all:4", "05_attention:all:5"]
    stores["04_kv_cache"] = _runs({i: ("all",) for i in range(6)})  # Study 4 was re-run: the check has its data
    assert campaign.rerun_jobs() == []
