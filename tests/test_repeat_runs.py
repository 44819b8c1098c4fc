"""The repeat runner: fresh papermill processes of a fake study whose verdicts depend on the seed, combined."""

import json

import nbformat
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.paths import REPO_ROOT
from servelab.studies.common.findings import Finding
from servelab.studies.common.repeat_runs import combine_findings, main, run_repeats, text_medians

FAKE = REPO_ROOT / "tests" / "data" / "repeat_fake_study.ipynb"


def _finding(value: str, verdict: str = "holds", fid: str = "F9.1") -> Finding:
    return Finding(id=fid, claim="c", seed_value="1", measured_value=value, unit="ms", verdict=verdict, note="rule")


@pytest.fixture(scope="module")
def fake_set(tmp_path_factory):
    """Three repeats of the fake study (seeds 4, 5, 6), each a papermill process, results under a scratch root."""
    tmp = tmp_path_factory.mktemp("repeats")
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVELAB_RESULTS", str(tmp / "results"))
    page, pages = tmp / "page.ipynb", tmp / "pages"
    with open(tmp / "log.txt", "w") as log:
        combined = run_repeats(
            "99_fake", 3, {"profile": "smoke", "seed": "4"}, notebook=FAKE, page=page, pages=pages, log=log
        )
    mp.undo()
    return combined, tmp / "results" / "fakegpu" / "99_fake", page, pages


def test_each_repeat_is_a_process_with_its_own_seed_and_folder(fake_set):
    _, study, _, pages = fake_set
    seeds = [json.loads((study / f"repeats/r{r}/run.json").read_text())["params"]["seed"] for r in range(3)]
    assert seeds == [4, 5, 6]
    assert [pd.read_csv(study / f"repeats/r{r}/raw.csv").seed.item() for r in range(3)] == [4, 5, 6]
    assert sorted(p.name for p in pages.iterdir()) == ["99_fake.r0.ipynb", "99_fake.r1.ipynb"]


def test_agreeing_repeats_give_the_median_and_interval(fake_set):
    combined, study, _, _ = fake_set
    top = pd.read_csv(study / "findings.csv", dtype=str).set_index("id")
    assert top.loc["FX.1", "verdict"] == "holds"
    assert top.loc["FX.1", "measured_value"] == "15"  # values 14, 15, 16
    assert top.loc["FX.1", "spread"] == "14–16"
    assert top.loc["FX.1", "repeats"] == "3"
    assert top.loc["FX.1", "repeat_verdicts"] == "holds;holds;holds"
    assert combined[0].measured_value == "15"


def test_disagreeing_repeats_give_inconclusive(fake_set):
    _, study, _, _ = fake_set
    top = pd.read_csv(study / "findings.csv", dtype=str).set_index("id")
    assert top.loc["FX.2", "verdict"] == "inconclusive"
    assert top.loc["FX.2", "repeat_verdicts"] == "holds;changes;holds"
    assert top.loc["FX.2", "measured_value"] == "5.5× at 512 tokens"  # each number's median: 4.5, 5.5, 6.5
    reps = pd.read_csv(study / "repeats.csv")
    assert len(reps) == 9 and list(reps[reps.id == "FX.2"].verdict) == ["holds", "changes", "holds"]


def test_a_headline_gives_the_median_and_interval_of_a_text_claim(fake_set):
    """FX.3's measured value is text; its headlines (40, 50, 60 % cut) give the median and interval, and the text
    keeps each number's median over the repeats."""
    combined, study, _, _ = fake_set
    top = pd.read_csv(study / "findings.csv", dtype=str, keep_default_na=False).set_index("id")
    assert top.loc["FX.3", "headline"] == "50.0" and top.loc["FX.3", "headline_unit"] == "% cut"
    assert top.loc["FX.3", "spread"] == "40–60" and top.loc["FX.3", "measured_value"] == "m: 5.0 → 1.0 ms; cut 50%"
    assert "median 50 % cut, 40–60 % cut over 3 repeats" in top.loc["FX.3", "note"]
    assert top.loc["FX.1", "headline"] == "" and top.loc["FX.1", "spread"] == "14–16"  # no headline: as before
    reps = pd.read_csv(study / "repeats.csv")
    assert list(reps[reps.id == "FX.3"].headline) == [40.0, 50.0, 60.0]
    assert combined[2].headline == 50.0


def test_the_last_repeat_is_the_page_and_shows_the_combined_verdicts(fake_set):
    _, study, page, pages = fake_set
    text = "".join(o.get("text", "") for c in nbformat.read(page, 4).cells for o in c.get("outputs", []))
    assert "VERDICT FX.2 inconclusive repeats=3" in text
    first = "".join(o.get("text", "") for c in nbformat.read(pages / "99_fake.r0.ipynb", 4).cells for o in c.outputs)
    assert "VERDICT FX.2 holds repeats=1" in first
    side = json.loads((study / "run.json").read_text())
    assert side["repeats"]["seeds"] == [4, 5, 6] and side["repeats"]["page"] == "repeats/r2"
    assert "repeat" not in side and (study / "raw.csv").exists()


def test_text_medians_keep_the_shape_and_refuse_other_text():
    assert text_medians(["1.40× (1,559 vs 3,015)", "1.44× (1,600 vs 3,100)", "1.50× (1,700 vs 3,000)"]) == (
        "1.44× (1,600 vs 3,015)"
    )
    assert text_medians(["qwen2-0.5b: +0.20", "qwen2-0.5b: -0.10", "qwen2-0.5b: +0.30"]) == "qwen2-0.5b: +0.20"
    assert text_medians(["n=2 at 128", "n=2 at 128; n=3 at 512"]) is None


def test_a_claim_missing_from_a_repeat_is_inconclusive():
    out = combine_findings([[_finding("1")], [_finding("2")], [_finding("3", fid="F9.2")]])
    assert [(f.id, f.verdict, f.repeats, f.repeat_verdicts) for f in out] == [
        ("F9.1", "inconclusive", 2, "holds;holds;missing"),
        ("F9.2", "inconclusive", 1, "missing;missing;holds"),
    ]


def test_fewer_than_three_repeats_are_refused():
    with pytest.raises(ParameterError, match="at least 3"):
        combine_findings([[_finding("1")], [_finding("2")]])
    with pytest.raises(ParameterError, match="at least 3"):
        main(["99_fake", "--repeats", "2", "--notebook", str(FAKE)])
