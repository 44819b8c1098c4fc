"""Step costs by kind from a server step log."""

import pandas as pd
import pytest

from servelab.studies.s01_scheduling.step_costs import step_costs, step_kind


def log(rows):
    return pd.DataFrame(
        [dict(model=m, start_s=t, end_s=t + ms / 1e3, prefill_tokens=p, decode_tokens=d) for m, t, ms, p, d in rows]
    )


def test_kinds():
    assert step_kind(0, 4) == "decode only" and step_kind(100, 0) == "prefill only" and step_kind(10, 3) == "mixed"


def test_medians_and_ratio_to_the_decode_step():
    steps = log(
        [
            ("a", 0, 2, 0, 8),
            ("a", 1, 4, 0, 8),
            ("a", 2, 3, 0, 8),
            ("a", 3, 30, 500, 8),
            ("a", 4, 50, 500, 8),
            ("a", 5, 100, 2000, 0),
            ("b", 0, 10, 0, 1),
        ]
    )
    t = step_costs(steps).set_index(["model", "kind"])
    assert t.loc[("a", "decode only"), "median_ms"] == pytest.approx(3)
    assert t.loc[("a", "mixed"), "median_ms"] == pytest.approx(40) and t.loc[("a", "mixed"), "steps"] == 2
    assert t.loc[("a", "mixed"), "x_decode_step"] == pytest.approx(40 / 3)
    assert t.loc[("a", "prefill only"), "median_tokens"] == 2000
    assert t.loc[("b", "decode only"), "x_decode_step"] == pytest.approx(1)
    assert list(t.loc["a"].index) == ["decode only", "mixed", "prefill only"]


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="prefill_tokens"):
        step_costs(pd.DataFrame({"model": ["a"], "start_s": [0.0], "end_s": [1.0], "decode_tokens": [1]}))


def test_study1s_page_shows_each_settings_step_costs():
    from servelab.studies.s01_scheduling.report import step_cost_view

    steps = log([("config:qwen2-0.5b", 0, 2, 0, 8), ("config:qwen2-0.5b", 1, 20, 500, 8)])
    steps = pd.concat([steps.assign(scheduler="chunked_prefill", budget=512), steps.assign(scheduler="fcfs", budget=0)])
    view = step_cost_view(steps).set_index("setting")  # one row per setting: a page's table stays short
    assert list(view.index) == ["chunked_prefill@512", "fcfs"] and view["model"].iloc[0] == "qwen2-0.5b"
    assert view.loc["fcfs", "mixed: median ms"] == "20.00 (10.0×)"
    assert view.loc["fcfs", "decode only: median ms"] == "2.00"
    assert view.loc["fcfs", "mixed: steps, median tokens"] == "1, 508"
    assert step_cost_view(pd.DataFrame()).empty
