"""The engine page's numbers in prose: computed from the benchmark's CSVs, with misses stated by how much."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from servelab.paths import REPO_ROOT
from servelab_book.engine_bench import find_bench
from servelab_book.engine_prose import (
    NOT_RUN,
    Goal,
    render_e2e,
    render_exactness_trained,
    render_failures,
    render_goals,
    render_long_context,
    render_mixed,
    render_offline,
)
from servelab_book.prepare import prepare

H200 = find_bench()


def write_bench(tmp_path, rows, **beside):
    d = tmp_path / "nvidia-h200" / "engine"
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "bench.csv", index=False)
    for name, frame in beside.items():
        pd.DataFrame(frame).to_csv(d / f"{name}.csv", index=False)
    return d / "bench.csv"


def test_goal_says_met_or_by_how_much_it_is_missed():
    upper, lower = Goal.parse("<= 0.6"), Goal.parse(">= 60000")
    assert str(upper) == "≤ 0.6" and str(lower) == "≥ 60,000"
    assert upper.outcome(0.5, "ms") == "met" and lower.outcome(61000, "tok/s") == "met"
    assert upper.outcome(0.9, "ms") == "missed: 1.50× the goal, 0.3 ms over"
    assert lower.outcome(45000, "tok/s") == "missed: 0.75 of the goal, 15,000 tok/s short"
    assert Goal.parse("") is None and Goal.parse("fast") is None


def test_goals_table_shows_the_profile_only_where_a_goal_is_missed(tmp_path):
    note = "graphs on; median of 10; profile: 320 kernels/step, GPU busy 41%; largest: k ×24 158 µs; others: hf 20 ms"
    bench = write_bench(
        tmp_path,
        [
            dict(metric="decode_ms", value=0.9, unit="ms", goal="<= 0.6", note=note),
            dict(metric="speedup", value=89.0, unit="x", goal=">= 20", note="ratio"),
            dict(metric="plain", value=1.0, unit="ms", goal="", note=""),
        ],
    )
    text = render_goals(bench)
    assert "missed: 1.50× the goal, 0.3 ms over" in text
    assert "320 kernels/step, GPU busy 41%; largest: k ×24 158 µs" in text and "others" not in text
    assert "plain" not in text  # no goal, no row
    speedup = text[text.index("speedup") :]
    assert "met" in speedup and "ratio" not in speedup
    assert render_goals(None) == NOT_RUN


def test_goals_table_writes_long_integers_in_a_profile_with_separators(tmp_path):
    note = "default: 37,226 tok/s (148756 tokens in 4.00 s; 1018 decode-graph steps, 65536 KV blocks)"
    bench = write_bench(tmp_path, [dict(metric="offline_tok_s", value=37226, unit="tok/s", goal=">= 60000", note=note)])
    text = render_goals(bench)
    assert "148,756 tokens" in text and "1,018 decode" in text and "65,536 KV" in text and "148756" not in text


def test_a_failed_row_is_named_with_its_reason(tmp_path):
    bench = write_bench(
        tmp_path,
        [
            dict(metric="offline_tok_s", value=100.0, unit="tok/s", note="default"),
            dict(
                metric="offline_tok_s_x", value=None, unit="tok/s", note="256 requests; x=8 failed: RuntimeError: boom"
            ),
        ],
    )
    text = render_failures(bench)
    assert text.count("has no value") == 1
    assert "`offline_tok_s_x`" in text and "`x=8`" in text and "`RuntimeError: boom`" in text


def test_mixed_step_beside_its_parts(tmp_path):
    lat = [
        dict(what="mixed step", new_tokens=512, decodes=63, decode_context=512, median_ms=3.0, host_ms=1.0),
        dict(what="its decodes alone", new_tokens=1, decodes=0, decode_context=0, median_ms=1.5, host_ms=0.4),
        dict(what="its chunk alone", new_tokens=512, decodes=0, decode_context=0, median_ms=2.5, host_ms=0.5),
    ]
    text = render_mixed(write_bench(tmp_path, [dict(metric="m", value=1, unit="ms")], latency=lat))
    assert "63 decodes at context 512" in text and "3.00 ms" in text and "4.00 ms together" in text
    assert "0.75 of its parts" in text


def test_sentences_are_left_out_when_their_rows_are_missing(tmp_path):
    bench = write_bench(tmp_path, [dict(metric="offline_tok_s", value=1.0, unit="tok/s")])
    for render in (render_failures, render_long_context, render_offline, render_mixed, render_e2e):
        assert render(bench) == "" and render(None) == ""
    assert render_exactness_trained(bench) == ""


@pytest.mark.skipif(H200 is None, reason="no H200 engine benchmark in data/results")
def test_the_h200_run_numbers_in_the_prose_are_the_csvs():
    rows = pd.read_csv(H200).set_index("metric")
    v = rows["value"]
    e2e = render_e2e(H200)
    forward = rows.loc["e2e_ms_per_token_b1", "roofline_bound"]
    assert f"{v['e2e_ms_per_token_b1']:.3f} ms" in e2e and f"{forward:.3f} ms" in e2e
    assert f"{v['e2e_ms_per_token_b1'] / forward:.2f}×" in e2e and f"{v['e2e_ms_per_token_b1_sync']:.3f} ms" in e2e
    offline = render_offline(H200)
    assert f"{v['offline_budget512_ratio']:.3f} of it" in offline
    assert f"{v['offline_tok_s']:,.0f} tok/s" in offline and f"{v['offline_tok_s_budget512']:,.0f} tok/s" in offline
    long_ = render_long_context(H200)
    assert f"{v['decode_ms_b1_ctx16384'] / v['decode_ms_b1_ctx128']:.2f}×" in long_
    for metric in rows.index[rows["value"].isna() & rows["note"].str.contains("failed", na=False)]:
        assert f"`{metric}`" in render_failures(H200)
    goals = render_goals(H200)
    for metric, r in rows[rows["goal"].notna()].iterrows():
        goal = Goal.parse(r["goal"])
        assert goal.met(r["value"]) == ("\n  - met\n" in goals.split(f"(`{metric}`)", 1)[1].split("* -", 1)[0])
    lat = pd.read_csv(H200.parent / "latency.csv").set_index("what")["median_ms"]
    assert f"{lat['mixed step']:.2f} ms" in render_mixed(H200)


def test_the_engine_page_includes_every_generated_engine_file(tmp_path):
    prepare(generated_dir=tmp_path, mathjax_target=None)
    made = {p.name for p in tmp_path.glob("engine_*.md")}
    page = (REPO_ROOT / "book" / "engine.md").read_text()
    included = set(re.findall(r"\{include\} _generated/(engine_\w+\.md)", page))
    assert made and included == made


def test_the_token_budget_per_step_is_not_called_the_step_budget(tmp_path):
    # the page calls the breakdown of a step's time "the step budget"; the offline sentence used the same words for
    # max_num_batched_tokens (issue 24 of the third audit)
    bench = write_bench(
        tmp_path,
        [
            dict(metric="offline_tok_s", value=37226.0, unit="tok/s", goal=""),
            dict(metric="offline_tok_s_budget512", value=29582.0, unit="tok/s", goal=""),
            dict(metric="offline_budget512_ratio", value=0.7947, unit="x", goal=">= 0.85"),
        ],
    )
    text = render_offline(bench)
    assert "step budget" not in text and "default token budget per step (`max_num_batched_tokens`)" in text
    goals = render_goals(bench)
    assert "Offline throughput at a token budget per step of 512 tokens, over the default's" in goals
    assert "  - 0.795 ×\n" in goals  # a ratio's unit as a sign, not "x"


def test_the_trained_exactness_sentence_counts_the_prompts_decoded_alone_where_the_run_has_them(tmp_path):
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    head = dict(model=model, engine="triton, compile on", steps=32, tf_argmax_agree_frac=1.0)
    rows = [dict(head, all_agree=a, alone_agree=b) for a, b in ((True, 32), (True, 12), (False, 32))]
    text = render_exactness_trained(write_bench(tmp_path, [dict(metric="m", value=1, unit="ms")], exactness=rows))
    assert "2 of 3 prompts agree with HF for all 32 greedy steps (2 of 3 decoded alone, at batch 1)" in text
    older = [{k: v for k, v in r.items() if k != "alone_agree"} for r in rows]  # runs from before the column
    text = render_exactness_trained(
        write_bench(tmp_path / "old", [dict(metric="m", value=1, unit="ms")], exactness=older)
    )
    assert "for all 32 greedy steps and" in text and "alone" not in text
