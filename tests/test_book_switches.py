"""The engine page's switches: each switch row against its default's row, better or worse by the unit's
direction, and a warning where the compile check ran the switch eagerly against a compiled default."""

from __future__ import annotations

import pandas as pd

from servelab_book.engine_switches import compile_off, default_of, render_switches, setting_of

DEFAULT_NOTE = "engine default configuration (backend triton, graphs=1, compile on (max |logit diff| vs eager 0.066))"
FUSED_NOTE = (
    "not the default: fused_rope_kv_write=True, otherwise the default (backend triton, graphs=1, compile off: "
    "compiled logits differ from eager by 4.51 (scale 3.22), fused RoPE + KV write, kernel KEYS=128)"
)

STEPS_NOTE = "decode_steps=8 (not the default)"


def _bench(tmp_path, rows):
    path = tmp_path / "bench.csv"
    cols = dict(roofline_bound="", pct_of_roofline="", goal="", meets_goal="")
    pd.DataFrame([cols | r for r in rows]).to_csv(path, index=False)
    return path


def test_a_switch_row_names_its_setting_and_finds_its_default_by_name():
    assert setting_of(FUSED_NOTE) == "fused_rope_kv_write=True"
    assert setting_of("256 requests; decode_steps=8 (not the default): 30,778 tok/s") == "decode_steps=8"
    assert setting_of(DEFAULT_NOTE) is None
    metrics = ["decode_ms_b1_ctx128", "decode_ms_b1_ctx128_fused_rope_kv", "decode_ms_b1_ctx1", "offline_tok_s"]
    assert default_of("decode_ms_b1_ctx128_fused_rope_kv", metrics) == "decode_ms_b1_ctx128"
    assert default_of("offline_tok_s_decode_steps8", metrics) == "offline_tok_s"
    assert default_of("decode_ms_b1_ctx128", metrics) is None
    assert compile_off(FUSED_NOTE) == "compiled logits differ from eager by 4.51"
    assert compile_off(DEFAULT_NOTE) is None


def test_each_switch_is_read_against_its_default_in_its_units_direction(tmp_path):
    bench = _bench(
        tmp_path,
        [
            dict(metric="decode_ms_b1_ctx128", value=0.96, unit="ms", note=DEFAULT_NOTE),
            dict(metric="decode_ms_b1_ctx128_fused_rope_kv", value=1.52, unit="ms", note=FUSED_NOTE),
            dict(metric="offline_tok_s", value=37000, unit="tok/s", note="default: 37,000 tok/s"),
            dict(metric="offline_tok_s_decode_steps8", value=40000, unit="tok/s", note=STEPS_NOTE),
            dict(metric="offline_tok_s_budget512", value=29000, unit="tok/s", note="max_num_batched_tokens=512"),
        ],
    )
    text = render_switches(bench)
    bullets = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(bullets) == 2 and "1 measures worse than the default" in text  # the budget row is no switch
    fused = next(b for b in bullets if "fused_rope_kv_write" in b)
    assert "1.58× the default: worse" in fused and "ran uncompiled" in fused and "by 4.51" in fused
    steps = next(b for b in bullets if "decode_steps=8" in b)
    assert "1.08× the default: better" in steps and "uncompiled" not in steps
    assert "the check's own fault" in text and text.count("same scratch slots") == 1  # said once, after the list


def test_a_switch_refused_by_the_check_for_no_known_fault_gets_no_explanation(tmp_path):
    other = FUSED_NOTE.replace("fused_rope_kv_write=True", "ragged_split_kv=True")
    bench = _bench(
        tmp_path,
        [
            dict(metric="decode_ms_b1_ctx128", value=0.96, unit="ms", note=DEFAULT_NOTE),
            dict(metric="decode_ms_b1_ctx128_split", value=1.2, unit="ms", note=other),
        ],
    )
    text = render_switches(bench)
    assert "ran uncompiled" in text and "scratch slots" not in text


def test_without_switch_rows_there_is_no_include_text(tmp_path):
    bench = _bench(tmp_path, [dict(metric="decode_ms_b1_ctx128", value=0.96, unit="ms", note=DEFAULT_NOTE)])
    assert render_switches(bench) == ""
    assert render_switches(None) == ""


def test_the_benchs_own_switch_labels_are_read_as_switches():
    """The sync row's note said "async scheduling off (not the default)", which names no key=value, so the page left
    it out of the switches; it and the offline ragged_split_kv row now name their settings."""
    from servelab.bench.latency_rows import SYNC_SETTING
    from servelab.bench.offline_rows import SPLIT_SETTING

    assert setting_of(f"{SYNC_SETTING}; 12 steps") == "async_scheduling=False"
    assert setting_of(f"256 requests; {SPLIT_SETTING}: 40,000 tok/s") == "ragged_split_kv=True"
    metrics = ["e2e_ms_per_token_b1", "e2e_ms_per_token_b1_sync", "offline_tok_s", "offline_tok_s_ragged_split_kv"]
    assert default_of("e2e_ms_per_token_b1_sync", metrics) == "e2e_ms_per_token_b1"
    assert default_of("offline_tok_s_ragged_split_kv", metrics) == "offline_tok_s"


def test_a_switch_inside_the_defaults_spread_is_neither_better_nor_worse(tmp_path):
    """One offline run read ragged_split_kv 3% above the default on an H100; the bench now times each setting three
    times and writes the range beside the median, and a switch whose range overlaps the default's is said to lie
    within the spread. Ranges apart keep the better/worse reading."""
    split = "ragged_split_kv=True (not the default): 50,707 tok/s"
    rows = [
        dict(metric="offline_tok_s", value=49284, unit="tok/s", note="default", low=48100, high=50300),
        dict(metric="offline_tok_s_ragged_split_kv", value=50707, unit="tok/s", note=split, low=49900, high=51000),
        dict(metric="decode_ms_b1_ctx128", value=0.71, unit="ms", note=DEFAULT_NOTE, low=0.70, high=0.72),
        dict(metric="decode_ms_b1_ctx128_fused_rope_kv", value=1.02, unit="ms", note=FUSED_NOTE, low=1.0, high=1.05),
    ]
    text = render_switches(_bench(tmp_path, rows))
    bullets = {b.split("`")[1]: b for b in text.splitlines() if b.startswith("- ")}
    assert (
        "1.03× the default: within the spread, 49,900–51,000 against the default's 48,100–50,300"
        in (bullets["ragged_split_kv=True"])
    )
    assert "the default: worse" in bullets["fused_rope_kv_write=True"]
    assert "1 measures worse than the default, and 1 within the spread of the default's own timings" in text
    apart = [dict(r, low=r["value"], high=r["value"]) for r in rows]  # no overlap: the reading by value returns
    assert "1.03× the default: better" in render_switches(_bench(tmp_path, apart))
    unspread = [{k: v for k, v in r.items() if k not in ("low", "high")} for r in rows]
    assert "within the spread" not in render_switches(_bench(tmp_path, unspread))  # an older CSV has no spread
