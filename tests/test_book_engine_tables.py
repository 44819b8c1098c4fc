"""The engine page's decode comparison and exactness tables, from synthetic benchmark CSVs."""

import json

import pandas as pd

from servelab_book.engine_tables import (
    engine_code_changed_since,
    render_code_status,
    render_decode_comparison,
    render_exactness,
)


def bench_dir(tmp_path):
    d = tmp_path / "nvidia-h200" / "engine"
    d.mkdir(parents=True)
    pd.DataFrame([{"metric": "offline_tok_s", "value": 1.0, "unit": "tok/s"}]).to_csv(d / "bench.csv", index=False)
    return d


def test_decode_table_has_each_impl_and_the_floor(tmp_path):
    d = bench_dir(tmp_path)
    rows = [
        dict(impl=i, batch=b, context=c, median_ms=m, floor_ms=f, pct_of_floor=100 * f / m, status=s)
        for i, b, c, m, f, s in [
            ("engine_triton", 1, 128, 1.0, 0.25, "ok"),
            ("hf_eager", 1, 128, 30.0, 0.25, "ok"),
            ("engine_triton", 64, 512, 2.0, 0.5, "ok"),
            ("hf_eager", 64, 512, 1e9, 0.5, "oom"),
            ("engine_triton", 1, 16384, 1.3, 0.3, "ok"),
        ]
    ]
    pd.DataFrame(rows).to_csv(d / "decode.csv", index=False)
    text = render_decode_comparison(d / "bench.csv")
    assert "1.00 ms (25.0%)" in text and "30.00 ms (0.8%)" in text and "2.00 ms (25.0%)" in text
    assert "0.250 ms" in text and "0.500 ms" in text  # the floor row
    assert text.count("hf\\_eager") == 1 and "oom" not in text
    assert "batch 1, context 16,384" in text and "16384" not in text


def test_exactness_table_summarises_prompts(tmp_path):
    d = bench_dir(tmp_path)
    rows = [
        dict(
            model="config:m",
            dtype="bfloat16",
            engine="triton",
            prompt=p,
            steps=32,
            tokens_agree=a,
            logit_max_abs_err=e,
            ref_top1_top2_gap=0.05,
            tf_argmax_agree_frac=t,
        )
        for p, a, e, t in [(0, 4, 0.01, 1.0), (1, 32, 0.03, 0.5), (2, 10, 0.02, 0.75)]
    ]
    pd.DataFrame(rows).to_csv(d / "exactness.csv", index=False)
    text = render_exactness(d / "bench.csv")
    assert "4 / 10 of 32" in text and "0.03" in text and "0.750" in text


def test_missing_files_say_so(tmp_path):
    assert "not been measured" in render_exactness(None)
    assert "No decode comparison" in render_decode_comparison(bench_dir(tmp_path) / "bench.csv")


def test_code_status_names_the_commit(tmp_path):
    d = bench_dir(tmp_path)
    (d / "run.json").write_text(json.dumps({"git_commit": "0000000000000000000000000000000000000000"}))
    assert engine_code_changed_since("0" * 40) is None  # not a commit of this history
    assert "could not be checked" in render_code_status(d / "bench.csv")


def test_caption_and_code_status_read_one_provenance(tmp_path):
    """The bench table's caption and the code-status line name the same commit, read once from run.json."""
    from servelab_book.engine_bench import bench_provenance, render_engine_bench

    d = bench_dir(tmp_path)
    assert bench_provenance(d / "bench.csv") is None and bench_provenance(None) is None
    assert render_code_status(d / "bench.csv") == ""  # no sidecar: nothing to say
    (d / "run.json").write_text(
        json.dumps(
            {"git_commit": "f" * 40 + "+dirty", "started_utc": "2026-12-02T14:00", "written_utc": "2026-12-02T14:05"}
        )
    )
    prov = bench_provenance(d / "bench.csv")
    assert prov.commit == "f" * 12 and prov.when == "2026-12-02T14:05"
    assert f"run at commit `{'f' * 12}` on 2026-12-02T14:05" in render_engine_bench(d / "bench.csv")
    assert f"`{'f' * 12}`" in render_code_status(d / "bench.csv")
    (d / "run.json").write_text(json.dumps({"started_utc": "2026-12-02T14:00"}))
    assert "commit `unknown` on 2026-12-02T14:00" in render_engine_bench(d / "bench.csv")
    assert "since commit `unknown` could not be checked" in render_code_status(d / "bench.csv")
    (d / "run.json").write_text("{not json")
    assert bench_provenance(d / "bench.csv") is None
    assert render_code_status(d / "bench.csv") == "" and "run at commit" not in render_engine_bench(d / "bench.csv")


def test_the_bench_table_names_metrics_in_words_and_says_what_each_bound_is(tmp_path):
    """A bound that is two measured parts (the mixed step) or the measured forward (one request end to end) is not a
    roofline: a column headed "roofline_bound" read 110% of it as beating the hardware (issue 7 of the third audit)."""
    from servelab_book.engine_bench import bound_kind, metric_words, render_engine_bench

    d = tmp_path / "nvidia-h200" / "engine"
    d.mkdir(parents=True)
    cols = ["metric", "value", "unit", "roofline_bound", "pct_of_roofline", "goal", "meets_goal", "note"]
    pd.DataFrame(
        [
            ["decode_ms_b1_ctx16384", 1.3, "ms", 0.278, 21.4, "<= 1", False, "graphs"],
            ["mixed_step_ms", 3.42, "ms", 3.76, 110.0, "", "", "bound: the decodes alone + the chunk alone"],
            ["e2e_ms_per_token_b1", 1.19, "ms/token", 1.13, 95.2, "", "", "bound: the captured forward alone"],
            ["offline_tok_s", 37226.0, "tok/s", 192363.0, 19.4, ">= 60000", False, "default"],
            ["engine_speedup_vs_hf", 68.8, "x", "", "", ">= 20", True, "ratio"],
        ],
        columns=cols,
    ).to_csv(d / "bench.csv", index=False)
    md = render_engine_bench(d / "bench.csv")
    assert "roofline\\_bound" not in md and "pct\\_of\\_roofline" not in md and "meets\\_goal" not in md
    assert "* - What is measured\n" in md and "  - Kind of bound\n" in md and "  - Value against its bound (%)\n" in md
    assert "One decode step, batch 1, 16,384 tokens of context (`decode_ms_b1_ctx16384`)" in md
    mixed = md.split("(`mixed_step_ms`)")[1].split("* -")[0]
    assert "  - its parts, measured\n" in mixed and "roofline" not in mixed.split("bound:")[0]
    assert "  - the forward, measured\n" in md.split("(`e2e_ms_per_token_b1`)")[1].split("* -")[0]
    assert "  - roofline ceiling\n" in md.split("(`offline_tok_s`)")[1].split("* -")[0]
    assert "  - ≤ 1\n" in md and "  - ≥ 60,000\n" in md and "  - missed\n" in md and "  - met\n" in md
    assert "  - ×\n" in md  # a ratio's unit
    legend = md.split(":::\n", 1)[1]  # the kinds present, defined under the table
    assert "**its parts, measured**" in legend and "not a roofline" in legend and "**roofline floor**" in legend
    assert "**matmul ceiling**" not in legend  # no prefill row here
    assert bound_kind("prefill_mfu_4096")[0] == "matmul ceiling" and bound_kind("new_metric")[0] == "bound"
    assert metric_words("offline_tok_s_budget512") == (
        "Offline throughput, token budget per step of 512 tokens (`offline_tok_s_budget512`)"
    )
    assert metric_words("decode_ms_b64_ctx512_fused_rope_kv").startswith(
        "One decode step, batch 64, 512 tokens of context, fused RoPE + KV write, not the default"
    )
    assert metric_words("decode_ms_b1_ctx128_unfused_rope_kv").startswith(
        "One decode step, batch 1, 128 tokens of context, RoPE and the KV write apart, not the default"
    )
    assert metric_words("decode_ms_b1_ctx128_no_small_batch").startswith(
        "One decode step, batch 1, 128 tokens of context, the model's own blocks at one row, not the default"
    )
    assert metric_words("something_new") == "`something_new`"
