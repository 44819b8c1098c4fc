"""``python -m servelab.bench --smoke`` runs end to end on the CPU and writes bench.csv with every row; one engine
step of each kind a server runs (``engine/bench/step.py``) is the step asked for."""

import pandas as pd
import pytest

from servelab.bench import run as bench
from servelab.bench.offline import offline_floor_s
from servelab.bench.step import engine_eager_step, engine_step, prepared_step, step_engine_config, timed_tokens
from servelab.bench.workload import offline_workload
from servelab.engine.engine import Engine
from servelab.errors import ParameterError
from servelab.measure import Roofline
from servelab.models import ModelShape, load_model


def test_smoke_bench_writes_every_row(scratch_results, capsys):
    assert bench.main(["--smoke", "--num-requests", "4"]) == 0
    df = pd.read_csv(next(scratch_results.glob("*/engine/bench.csv")))
    assert list(df.columns[:3]) == ["metric", "value", "unit"]
    assert set(df["metric"]) == {
        "decode_ms_b1_ctx16",
        "decode_ms_b4_ctx32",
        "decode_ms_b1_ctx256",  # the long-context point (16K on a GPU)
        "offline_tok_s",
        "offline_tok_s_budget32",  # the small-budget point (512 on a GPU)
        "offline_budget32_ratio",
        "offline_tok_s_decode_steps8",  # multi-step decoding on the default engine: every row and block given back
        "hf_offline_tok_s",
        "engine_speedup_vs_hf",
        "e2e_ms_per_token_b1",
        "e2e_over_forward_b1",
        "mixed_step_ms",
        "prefill_mfu_128",
    }
    rows = df.set_index("metric")
    assert rows["value"].gt(0).all(), rows["value"]  # every row measured, none skipped or failed
    offline = pd.read_csv(next(scratch_results.glob("*/engine/offline.csv"))).set_index("setting")
    multi = offline.loc["decode_steps=8 (not the default)"]
    assert multi["decode_steps"] == 8 and multi["decode_groups"] > 0  # the row ran multi-step groups
    # each setting timed 3 times on its engine: the median run, with the runs' range in offline.csv and bench.csv
    engine = offline[offline["impl"] == "engine"]
    assert len(engine) == 3 and (engine["runs"] == 3).all() and (engine["tok_s_min"] <= engine["tok_s"]).all()
    assert (engine["tok_s"] <= engine["tok_s_max"]).all()
    assert rows.loc["offline_tok_s", "low"] == offline.loc["default", "tok_s_min"]
    assert rows.loc["offline_tok_s", "high"] == offline.loc["default", "tok_s_max"]
    assert "median of 3 runs" in rows.loc["offline_tok_s", "note"]
    assert rows.loc["decode_ms_b1_ctx16", "low"] <= rows.loc["decode_ms_b1_ctx16", "value"]  # the steps' quartiles
    assert rows.loc["decode_ms_b1_ctx16", "value"] <= rows.loc["decode_ms_b1_ctx16", "high"]
    assert rows.loc["offline_budget32_ratio", ["low", "high"]].isna().all()  # a ratio of medians has no spread here
    for metric in ("mixed_step_ms", "e2e_ms_per_token_b1", "offline_tok_s_budget32", "decode_ms_b1_ctx256"):
        assert rows.loc[metric, "roofline_bound"] > 0, metric  # each beside its bound
    assert rows.loc["e2e_over_forward_b1", "value"] == pytest.approx(
        rows.loc["e2e_ms_per_token_b1", "value"] / rows.loc["e2e_ms_per_token_b1", "roofline_bound"]
    )
    assert "overlapped" in rows.loc["e2e_ms_per_token_b1", "note"]  # the step log's summary
    latency = pd.read_csv(next(scratch_results.glob("*/engine/latency.csv")))
    assert list(latency["what"]) == ["mixed step", "its decodes alone", "its chunk alone"]
    assert (latency["status"] == "ok").all() and latency["host_ms"].gt(0).all()
    exact = pd.read_csv(next(scratch_results.glob("*/engine/exactness.csv")))
    assert exact["all_agree"].all() and exact["logit_max_abs_err"].max() < 1e-3  # float32: identical tokens
    assert (exact["alone_agree"] == exact["steps"]).all()  # each prompt alone too: the engine's batch-1 path
    assert (exact["tf_argmax_agree_frac"] == 1).all() and exact["tf_logit_max_abs_err"].max() < 1e-3
    decode = pd.read_csv(next(scratch_results.glob("*/engine/decode.csv")))
    assert set(decode["impl"]) == {"engine_default", "hf_eager"} and (decode["status"] == "ok").all()
    assert "offline_tok_s" in capsys.readouterr().out  # the summary table


@pytest.mark.parametrize("argv", [["--max-len", "5", "--min-len", "10"], ["--num-requests", "0"], ["--hf-batch", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    assert bench.main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_workload_lengths_are_in_range_and_reproducible():
    w = offline_workload(50, 100, 1024, vocab=1000, seed=3)
    assert w.num_requests == 50 and w == offline_workload(50, 100, 1024, vocab=1000, seed=3)
    lens = [len(p) for p in w.prompts] + w.output_lens
    assert min(lens) >= 100 and max(lens) <= 1024
    assert max(max(p) for p in w.prompts) < 1000
    with pytest.raises(ParameterError):
        offline_workload(10, 50, 20, vocab=1000)


def test_offline_floor_is_the_sum_of_prefill_and_per_step_floors():
    shape = ModelShape.from_config(load_model("config:tiny-qwen2").model.config)
    roof = Roofline(matmul_tflop_s=1.0, copy_gb_s=1.0)
    one = offline_workload(1, 10, 10, vocab=100)
    flops = shape.prefill_flops(10)
    decode = [
        roof.floor_ms(shape.decode_flops(1, 10 + k), shape.decode_bytes(1, 10 + k - 1, 2) + shape.kv_bytes_per_token(2))
        for k in range(1, 10)
    ]
    expected = float(roof.compute_ms(flops)) / 1e3 + sum(float(d) for d in decode) / 1e3
    assert offline_floor_s(shape, one, roof) == pytest.approx(expected, rel=1e-6)


def test_decode_plot_draws_every_implementation_and_the_floor():
    import matplotlib

    matplotlib.use("Agg")
    from servelab.bench.plots import plot_decode_steps

    df = pd.DataFrame(
        [
            {"impl": i, "batch": b, "context": c, "median_ms": m, "floor_ms": 0.2, "status": "ok"}
            for i, m in (("hf_eager", 60.0), ("engine_triton", 0.9))
            for b, c in ((1, 128), (64, 512))
        ]
    )
    ax = plot_decode_steps(df)
    labels = ax.get_legend_handles_labels()[1]
    assert {"hf_eager", "engine_triton", "roofline floor"} <= set(labels)
    assert ax.get_yscale() == "log" and "ms" in ax.get_ylabel()


# ---- one engine step of each kind a server runs (engine/bench/step.py) ----------------------------------------


@pytest.fixture(scope="module")
def tiny_llama():
    import torch

    torch.manual_seed(0)
    return load_model("config:tiny-llama", dtype="float32", device="cpu").model


STEPS = {  # (batch, new_tokens, context, decodes, decode_context) -> sorted (start, tokens) of the timed step
    "decode": ((3, 1, 20, 0, 0), [(20, 1)] * 3),
    "prefill": ((2, 12, 0, 0, 0), [(0, 12)] * 2),
    "chunk after a longer context": ((1, 8, 40, 0, 0), [(40, 8)]),
    "chunk longer than its context": ((1, 40, 8, 0, 0), [(8, 40)]),
    "chunks after cached prefixes": ((3, 8, 32, 0, 0), [(32, 8)] * 3),
    "mixed, a first chunk": ((1, 16, 0, 3, 20), [(0, 16)] + [(20, 1)] * 3),
    "mixed, a chunk after context": ((1, 16, 24, 3, 20), [(20, 1)] * 3 + [(24, 16)]),
}


@pytest.mark.parametrize("name", list(STEPS))
def test_the_timed_step_is_the_one_asked_for(tiny_llama, name):
    (b, n, c, d, dc), expected = STEPS[name]
    engine = Engine.from_hf(tiny_llama, step_engine_config(b, n, c, decodes=d, decode_context=dc))
    step = prepared_step(engine, b, n, c, decodes=d, decode_context=dc)
    assert sorted((it.start, it.num_tokens) for it in step.items) == sorted(expected)
    assert step.num_tokens == timed_tokens(b, n, d)
    assert all(it.samples for it in step.items)  # every item ends its prompt (or decodes): one logits row each
    logits = engine.runner.logits(step)[0]
    assert logits.shape == (b + d, tiny_llama.config.vocab_size) and logits.isfinite().all()


@pytest.mark.parametrize("batch, context", [(1, 24), (2, 32)])
def test_a_chunk_after_context_gives_the_logits_of_the_whole_prompt(tiny_llama, batch, context):
    """The chunk attends to the cached context: its last logits equal HF's forward over the whole prompt."""
    import torch

    fn, _ = engine_step(tiny_llama, batch, 8, context)
    got = fn()
    prompts = torch.tensor([s.seq.prompt_token_ids for s in fn.step.items])
    with torch.inference_mode():
        want = tiny_llama(prompts).logits[:, -1]
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("name", [n for n in STEPS if n != "decode"])
def test_the_step_fits_exactly_one_whole_step_graph(tiny_llama, name):
    """On a GPU the engine captures one graph at the step's token count; on the CPU the same bucketed path runs
    uncaptured, and must give the eager step's logits."""
    (b, n, c, d, dc), _ = STEPS[name]
    fn, _ = engine_step(tiny_llama, b, n, c, decodes=d, decode_context=dc)
    cfg = fn.engine.config
    assert cfg.step_graphs and cfg.step_graph_sizes == (timed_tokens(b, n, d),) and not cfg.cuda_graphs
    eager = fn().clone()
    assert fn.path() == "eager"  # no graph on a CPU
    fn.engine.runner.enable_step_graphs(cfg.step_graph_sizes, capture=False)
    assert (fn() - eager).abs().max() < 1e-4
    assert fn.engine.runner.step_graph_steps == 1 and fn.path() == "step graph, eager"


@pytest.mark.parametrize("name", [n for n in STEPS if n != "decode"])
def test_the_eager_mode_runs_the_graphs_kernels_uncaptured(tiny_llama, name, monkeypatch):
    """Study 2's ``engine_eager`` against ``engine`` is launch overhead only if both run the same kernels: the eager
    prefill or mixed step goes through the ragged step its whole-step graph replays (the ragged attention), not the
    unbucketed path, and gives the same logits."""
    from servelab.kernels import attention

    (b, n, c, d, dc), _ = STEPS[name]
    graphed, _ = engine_step(tiny_llama, b, n, c, decodes=d, decode_context=dc)
    graphed.engine.runner.enable_step_graphs(graphed.engine.config.step_graph_sizes, capture=False)
    want = graphed().clone()
    fn, _ = engine_eager_step(tiny_llama, b, n, c, decodes=d, decode_context=dc)
    calls = []
    ragged = attention.ragged_attention
    monkeypatch.setattr(attention, "ragged_attention", lambda *a, **k: calls.append(1) or ragged(*a, **k))
    got = fn()
    assert calls and fn.path() == "ragged step, uncaptured" and not fn.engine.config.step_graphs
    assert (got - want).abs().max() < 1e-4


def test_engine_configs_by_kind_and_mode():
    dec = step_engine_config(4, 1, 128)
    assert dec.cuda_graphs and dec.graph_batch_sizes == (4,) and not dec.step_graphs
    assert dec.max_num_batched_tokens >= 4 * 128  # the preparing prefill runs in one step
    pre = step_engine_config(2, 64, 0)
    assert pre.step_graphs and pre.step_graph_sizes == (128,) and not pre.cuda_graphs
    assert step_engine_config(2, 64, 32).prefix_caching and not step_engine_config(1, 64, 32).prefix_caching
    for cfg in (
        step_engine_config(4, 1, 128, graphs=False),
        step_engine_config(1, 8, 8, decodes=2, decode_context=4, graphs=False),
    ):
        assert not cfg.cuda_graphs and not cfg.step_graphs


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch=2, new_tokens=8, context=0, decodes=2, decode_context=16),
        dict(batch=1, new_tokens=8, context=8, decodes=2, decode_context=1),
        dict(batch=1, new_tokens=8, context=8, decode_context=16),
        dict(batch=0, new_tokens=8, context=0),
        dict(batch=1, new_tokens=8, context=-1),
    ],
)
def test_steps_the_engine_cannot_run_are_refused(tiny_llama, kw):
    with pytest.raises(ParameterError):
        engine_step(tiny_llama, **kw)


def test_cached_prefixes_must_fill_whole_blocks(tiny_llama):
    with pytest.raises(ParameterError, match="multiple of the block size"):
        engine_step(tiny_llama, 2, 8, 24)


def test_the_unfused_rope_kv_rows_are_planned_beside_the_default_rows(monkeypatch):
    """Planned, not timed: on a CUDA machine with Triton, decode points (1, 128) and (64, 512) also time the engine
    with ``fused_rope_kv_write=False`` (the path the default replaced) as labelled rows; the default rows stay the
    default's ("auto", which is the fused kernel there)."""
    from servelab.bench import decode_rows
    from servelab.bench.decode_rows import NO_PDL, NO_SMALL_BATCH, UNFUSED_ROPE_KV, Variant, labelled_rows, variants

    plan = bench.make_plan(bench.parse_args(["--quick", "--device", "cuda"]))
    monkeypatch.setattr(decode_rows, "fused_rope_kv_runs", lambda cuda: cuda)  # as on the H200
    monkeypatch.setattr(decode_rows, "pdl_runs", lambda cuda: cuda)  # a Hopper GPU
    assert labelled_rows(plan, cuda=True) == {
        "decode_ms_b1_ctx128": "engine_default",
        "decode_ms_b1_ctx128_unfused_rope_kv": UNFUSED_ROPE_KV,
        "decode_ms_b1_ctx128_no_small_batch": NO_SMALL_BATCH,  # one-row points only: small_batch's
        "decode_ms_b1_ctx128_no_pdl": NO_PDL,
        "decode_ms_b64_ctx512": "engine_default",
        "decode_ms_b64_ctx512_unfused_rope_kv": UNFUSED_ROPE_KV,
        "decode_ms_b64_ctx512_no_pdl": NO_PDL,
        "decode_ms_b1_ctx16384": "engine_default",
    }
    assert Variant(NO_PDL, "auto", "auto", pdl=False) in variants(plan, True, 64, 512)
    assert step_engine_config(1, 1, 128, pdl=False).pdl is False and step_engine_config(1, 1, 128).pdl == "auto"
    timed = variants(plan, True, 64, 512)
    assert timed[0] == Variant("engine_default", "auto", "auto", "auto")  # the row's implementation: the default
    assert Variant(UNFUSED_ROPE_KV, "auto", "auto", False) in timed
    assert not any(v.impl == NO_SMALL_BATCH for v in timed)  # 64 rows: the small blocks would not run anyway
    assert Variant(NO_SMALL_BATCH, "auto", "auto", "auto", False) in variants(plan, True, 1, 128)
    assert step_engine_config(1, 1, 128, small_batch=False).small_batch is False
    assert all(v.fused_rope_kv_write == "auto" for v in variants(plan, True, 1, 16384) if v.backend is not None)
    assert step_engine_config(1, 1, 128, fused_rope_kv_write=False).fused_rope_kv_write is False  # the engine it times
    assert step_engine_config(1, 1, 128).fused_rope_kv_write == "auto"
    # where the kernel cannot run (no CUDA), and in the smoke run, no such row
    assert list(labelled_rows(plan, cuda=False)) == [
        "decode_ms_b1_ctx128",
        "decode_ms_b64_ctx512",
        "decode_ms_b1_ctx16384",
    ]
    smoke = bench.make_plan(bench.parse_args(["--smoke"]))
    assert not any(name.endswith("_unfused_rope_kv") for name in labelled_rows(smoke, cuda=True))


def test_the_bench_agreement_counts_eos_as_an_ordinary_token():
    # tiny-gpt2 drawn at std 0.1 picks its EOS (id 0) as the first token after this prompt: an HF reference that held
    # EOS back (min_new_tokens) parted from the engine there, and the bench read it as a disagreement
    from hf_reference import varied

    from servelab.bench.exactness import greedy_agreement, hf_greedy
    from servelab.engine import Engine, EngineConfig

    hf = varied("tiny-gpt2")
    prompt = [398, 423, 288]
    ref, _ = hf_greedy(hf, prompt, 6)
    engine = Engine.from_hf(hf, EngineConfig(max_num_seqs=2, num_blocks=16, max_model_len=64))
    df = greedy_agreement(hf, engine, [prompt], 6)
    assert ref[0] == hf.config.eos_token_id  # EOS is on the path, so the test can tell the two references apart
    assert df.tokens_agree.tolist() == [6] and df.tf_argmax_agree_frac.tolist() == [1.0]
