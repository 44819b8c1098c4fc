"""What the step budget says stands in the way of each missed goal: a goal finds its own step kind by name, the
cut it asks for is read against the classes' time above their floors, and a goal without a step kind says so."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from servelab_book.engine_prose import Goal
from servelab_book.engine_step_reading import (
    excesses,
    render_step_reading,
    share_to_cut,
    step_of,
    what_would_have_to_go,
)

SHAPES = {
    "decode_b1_ctx128": dict(kind="decode", batch=1, new_tokens=1, context=128, decodes=0, decode_context=0),
    "prefill_b1_4096": dict(kind="prefill", batch=1, new_tokens=4096, context=0, decodes=0, decode_context=0),
    "mixed_d63_ctx512_chunk512": dict(kind="mixed", batch=1, new_tokens=512, context=0, decodes=63, decode_context=512),
}
# class -> (busy ms, floor ms, kernels) for the decode step: GEMM furthest above its floor, then norm, attention
DECODE = dict(gemm=(0.6, 0.2, 121), attention=(0.1, 0.0, 24), norm_elementwise=(0.2, 0.0, 121))


def _budget(tmp_path, busy_union=0.9, step_ms=0.95, model="config:qwen2-0.5b"):
    rows = []
    for step, shape in SHAPES.items():
        for cls, (busy, floor, kernels) in DECODE.items():
            rows.append(
                dict(step=step, **shape, **{"class": cls}, kernels=kernels, busy_ms=busy, floor_ms=floor)
                | dict(step_ms=step_ms, busy_union_ms=busy_union, graph_idle_ms=0.02, status="ok")
            )
    path = tmp_path / "step_budget.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    (tmp_path / "step_budget.run.json").write_text(json.dumps({"params": {"model": model}}))
    return path


def _bench(tmp_path, rows, params=None):
    path = tmp_path / "bench.csv"
    cols = dict(roofline_bound="", pct_of_roofline="", meets_goal="", note="")
    pd.DataFrame([cols | r for r in rows]).to_csv(path, index=False)
    (tmp_path / "run.json").write_text(json.dumps({"params": params or {"model": "config:qwen2-0.5b"}}))
    return path


def test_a_goal_finds_the_step_kind_of_its_own_shape_and_no_other():
    steps = pd.DataFrame([dict(step=s, **shape) for s, shape in SHAPES.items()])
    assert step_of("decode_ms_b1_ctx128", steps) == "decode_b1_ctx128"
    assert step_of("decode_ms_b64_ctx512", steps) is None  # no budget row at batch 64
    assert step_of("prefill_mfu_4096", steps) == "prefill_b1_4096"
    assert step_of("prefill_mfu_2048", steps) is None
    assert step_of("offline_budget512_ratio", steps) == "mixed_d63_ctx512_chunk512"
    assert step_of("offline_tok_s", steps) is None


@pytest.mark.parametrize(
    "goal,value,share",
    [("<= 0.6", 0.96, 0.375), (">= 60000", 30000, 0.5), (">= 0.6", 0.6, 0.0)],
)
def test_the_share_to_cut_treats_a_rate_as_the_inverse_of_a_time(goal, value, share):
    assert share_to_cut(Goal.parse(goal), value) == pytest.approx(share)


def test_the_cut_is_read_against_the_largest_excesses_first(tmp_path):
    rows = pd.read_csv(_budget(tmp_path)).query("step == 'decode_b1_ctx128'")
    assert list(excesses(rows)["class"]) == ["gemm", "norm_elementwise", "attention"]
    assert what_would_have_to_go(rows, 0.2) == "50% of the GEMM excess alone"
    assert "GEMM and norm" in what_would_have_to_go(rows, 0.5)
    assert "more than every class's excess" in what_would_have_to_go(rows, 1.0)


def test_each_missed_goal_gets_a_bullet_and_a_met_one_none(tmp_path):
    bench = _bench(
        tmp_path,
        [
            dict(metric="decode_ms_b1_ctx128", value=0.96, unit="ms", goal="<= 0.6"),
            dict(metric="e2e_over_forward_b1", value=1.05, unit="x", goal="<= 1.3"),
            dict(metric="offline_tok_s", value=37000, unit="tok/s", goal=">= 60000"),
            dict(metric="prefill_mfu_4096", value=0.5, unit="fraction", goal=">= 0.6"),
        ],
        params={"model": "config:qwen2-0.5b", "mfu_model": "config:qwen2-1.5b"},
    )
    text = render_step_reading(bench, _budget(tmp_path))
    bullets = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(bullets) == 3 and not any("e2e_over_forward_b1" in b for b in bullets)
    decode = next(b for b in bullets if "decode_ms_b1_ctx128" in b)
    assert "0.9 ms, 95% of the step's time" in decode and "the kernels' own" in decode
    assert "GEMM +0.4 ms (0.6 ms, 3.0× its floor, 121 kernels)" in decode and "config:" not in decode
    assert "no step kind of the budget" in next(b for b in bullets if "offline_tok_s" in b)
    mfu = next(b for b in bullets if "prefill_mfu_4096" in b)
    assert "on config:qwen2-1.5b; the budget's step is config:qwen2-0.5b's" in mfu


def test_a_step_the_kernels_do_not_fill_says_where_the_rest_went(tmp_path):
    bench = _bench(tmp_path, [dict(metric="decode_ms_b1_ctx128", value=0.96, unit="ms", goal="<= 0.6")])
    text = render_step_reading(bench, _budget(tmp_path, busy_union=0.5, step_ms=1.0))
    assert "50% of the step's time; the rest is the GPU idle (0.02 ms of it inside the captured graph)" in text


def test_without_a_budget_or_a_missed_goal_there_is_nothing_to_read(tmp_path):
    met = _bench(tmp_path, [dict(metric="decode_ms_b1_ctx128", value=0.5, unit="ms", goal="<= 0.6")])
    assert render_step_reading(met, _budget(tmp_path)) == ""
    assert render_step_reading(met, None) == ""
    assert render_step_reading(None, _budget(tmp_path)) == ""
