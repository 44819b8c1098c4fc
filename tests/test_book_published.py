"""Against published results: every study has a published number with its hardware and a bibliography entry, and
its H200 counterpart is computed from the committed results."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from servelab.paths import REPO_ROOT
from servelab_book.published import OURS, load_published, render_all_published, render_published, table
from servelab_book.studies import STUDIES

RESULTS = REPO_ROOT / "data" / "results"
BIB_KEYS = set(re.findall(r"@\w+\{([^,]+),", (REPO_ROOT / "book" / "references.bib").read_text()))


def test_every_study_has_a_published_number_with_hardware_and_a_bib_entry():
    pub = load_published()
    assert {s.slug for s in STUDIES} <= set(pub["study"])
    assert (pub["hardware"].str.len() > 0).all() and (pub["unit"].str.len() > 0).all()
    assert set(pub["source"]) <= BIB_KEYS
    for key in ("shah2024flashattention3", "kwon2023vllm", "zheng2024sglang", "agrawal2024sarathi"):
        assert key in set(pub["source"])
    bib = (REPO_ROOT / "book" / "references.bib").read_text()
    for key in set(pub["source"]):
        entry = bib.split("{" + key + ",")[1].split("\n}")[0]
        assert "Measured on" in entry, f"{key}: the bibliography entry names no hardware"


@pytest.mark.parametrize("study", list(OURS))
def test_our_number_is_computed_from_the_committed_results(study):
    t = table(study, RESULTS)
    assert len(t) >= 1 and not (t["h200"] == "not measured").any(), t.to_dict("records")


def test_our_numbers_follow_the_data(tmp_path):
    d = tmp_path / "nvidia-h200" / "05_attention"
    d.mkdir(parents=True)
    pd.DataFrame(
        [
            {
                "status": "ok",
                "achieved_tflop_s": 512.4,
                "backend": "flash",
                "variant": "sdpa",
                "dtype": "bf16",
                "q_len": 8,
            },
            {"status": "error", "achieved_tflop_s": 9e9, "backend": "x", "variant": "x", "dtype": "x", "q_len": 1},
        ]
    ).to_csv(d / "prefill.csv", index=False)
    row = table("05_attention", tmp_path).iloc[0]
    assert row["h200"] == "512 TFLOP/s" and "flash" in row["h200_what"] and row["published"] == "740 TFLOP/s"
    assert table("04_kv_cache", tmp_path)["h200"].tolist() == ["not measured"]


def test_the_book_tables_cite_their_sources():
    md = render_published("05_attention", RESULTS)
    assert "{cite:p}`shah2024flashattention3`" in md and "H100" in md
    assert render_all_published(RESULTS).count("### Study ") == len(STUDIES)
