"""Study 3 reads the α of real drafts from Study 6's run on the same device, and says when there is none."""

import pandas as pd
import pytest

from servelab.studies.s03_speculative.measured_alpha import measured_alpha, measured_alpha_note


def test_no_study6_run_gives_none_and_the_page_says_so(tmp_path):
    assert measured_alpha(tmp_path) is None
    assert "No α from trained drafts on the H200" in measured_alpha_note(None, "H200")


def test_study6_alpha_is_read_with_its_intervals(tmp_path):
    folder = tmp_path / "06_hf_assisted"
    folder.mkdir()
    rows = [("draft-2l → smollm2", 0.61, 0.55, 0.66, 32), ("prompt-lookup → smollm2", 0.18, 0.12, 0.25, 32)]
    pd.DataFrame(rows, columns=["pair", "alpha", "ci_low", "ci_high", "prompts"]).to_csv(
        folder / "real_alpha.csv", index=False
    )
    got = measured_alpha(tmp_path)
    assert list(got.pair) == [r[0] for r in rows] and got.alpha.tolist() == [0.61, 0.18]
    note = measured_alpha_note(got, "H200")
    assert "draft-2l → smollm2 0.61 [0.55, 0.66]" in note and "prompt-lookup → smollm2 0.18" in note


def test_a_table_without_intervals_is_refused(tmp_path):
    folder = tmp_path / "06_hf_assisted"
    folder.mkdir()
    pd.DataFrame({"pair": ["a → b"], "alpha": [0.5]}).to_csv(folder / "real_alpha.csv", index=False)
    with pytest.raises(ValueError, match="ci_high"):
        measured_alpha(tmp_path)
