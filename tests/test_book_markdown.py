"""Thousands separators in the book's text (``common.markdown.format_value``): in every number of 1,000 or more,
never inside an identifier, a setting name or a date (the findings page read "chunked\\_prefill@2,048")."""

from __future__ import annotations

import pandas as pd
import pytest

from servelab.studies.common.markdown import format_value, separated


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("prefill at ≥ 4096 tokens", "prefill at ≥ 4,096 tokens"),
        ("(8192 prefill and 0 decode tokens)", "(8,192 prefill and 0 decode tokens)"),
        ("TTFT p50 36643.3, 1103.1 ms", "TTFT p50 36,643.3, 1,103.1 ms"),  # decimals kept; once read "1,2345.6"
        ("12345.678 ms", "12,345.678 ms"),
        ("1880–1882 GB/s", "1,880–1,882 GB/s"),
        ("kernels launched 1075 / 1250", "kernels launched 1,075 / 1,250"),
        ("already 1,234 and 0.12345", "already 1,234 and 0.12345"),
    ],
)
def test_long_numbers_in_text_carry_separators(raw, shown):
    assert format_value(raw) == shown


@pytest.mark.parametrize(
    "raw",
    [
        "926 tok/s vs best 953 (chunked_prefill@2048)",
        "ChunkedPrefill@2048",
        "qwen-fcfs-chunked2048",
        "run 10916fee7fcd",
        "commit 1234abc",
        "issue #1234",
        "started 2026-12-04 01:04 UTC",
    ],
)
def test_separators_never_go_inside_identifiers_or_dates(raw):
    assert format_value(raw) == raw
    # beside a long number on its own, that number is separated and the identifier is not
    assert format_value(f"{raw}; 8192 tokens") == f"{raw}; 8,192 tokens"


def test_separated_writes_thousands_separators_and_leaves_missing_and_text_alone():
    df = pd.DataFrame({"n": [8192.0, None, 64.0], "ms": [1137.71, 3.0, "—"], "kept": [1234.5, 1.0, 2.0]})
    out = separated(df, ["n", "ms", "absent"], {"ms": 1})
    assert out["n"].tolist()[::2] == ["8,192", "64"] and pd.isna(out["n"][1])
    assert out["ms"].tolist() == ["1,137.7", "3.0", "—"]
    assert out["kept"].tolist() == [1234.5, 1.0, 2.0]  # a column not named is untouched
    assert separated(df, ["kept"], 2)["kept"].tolist() == ["1,234.50", "1.00", "2.00"]
    assert pd.isna(separated(pd.DataFrame({"x": pd.array([pd.NA, 5000], dtype="Int64")}), ["x"])["x"][0])
