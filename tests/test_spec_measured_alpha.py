"""Study 3 reads the α of real drafts from Study 6's runs (``study_runs``); "not measured" when there is none."""

import json

import pandas as pd

from servelab.studies.s03_speculative.measured_alpha import measured_alpha_note, study6_alpha


def _run(root, table: pd.DataFrame | None):
    d = root / "nvidia-h200" / "06_hf_assisted" / "runs" / "fp" / "all" / "r0"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"complete": True, "fingerprint": "fp", "part": "all", "repeat_index": 0}))
    if table is not None:
        table.to_csv(d / "real_alpha.csv", index=False)


def test_no_study6_run_gives_none_and_the_page_says_so(tmp_path):
    assert study6_alpha(tmp_path) is None
    _run(tmp_path, None)  # a Study 6 run without the table
    assert study6_alpha(tmp_path) is None
    assert "not measured" in measured_alpha_note(None, "H200")


def test_study6_alpha_is_read_with_its_intervals(tmp_path):
    rows = [("draft-2l → smollm2", 0.61, 0.55, 0.66, 32), ("prompt-lookup → smollm2", 0.18, 0.12, 0.25, 32)]
    _run(tmp_path, pd.DataFrame(rows, columns=["pair", "alpha", "ci_low", "ci_high", "prompts"]))
    got = study6_alpha(tmp_path)
    assert list(got.pair) == [r[0] for r in rows] and got.alpha.tolist() == [0.61, 0.18]
    note = measured_alpha_note(got, "H200")
    assert "draft-2l → smollm2 0.61 [0.55, 0.66]" in note and "prompt-lookup → smollm2 0.18" in note


def test_a_table_without_intervals_is_not_used(tmp_path):
    _run(tmp_path, pd.DataFrame({"pair": ["a → b"], "alpha": [0.5]}))
    assert study6_alpha(tmp_path) is None


def test_todays_study6_runs_give_the_alpha_its_own_page_shows():
    """Study 6's runs since SmolLM2 keep per-prompt agreement (alpha_hits.csv), not real_alpha.csv: Study 3 reads α
    through Study 6's report, so both pages show the same numbers (a reader saw "not measured" on one and α on the
    other)."""
    from servelab.paths import REPO_ROOT
    from servelab.studies.common.runs import study_runs
    from servelab.studies.s06_hf_assisted.alpha import real_alpha

    committed = REPO_ROOT / "data" / "results"
    runs = study_runs("06_hf_assisted", committed)
    if not runs.measured or runs.table("alpha_hits").empty:
        import pytest

        pytest.skip("no committed Study 6 run with per-prompt agreement")
    got = study6_alpha(committed)
    assert got is not None and got.alpha.tolist() == real_alpha(runs).alpha.tolist()
    assert "not measured" not in measured_alpha_note(got, "H200")
