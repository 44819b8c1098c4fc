"""``python -m servelab.bench --smoke`` runs end to end on the CPU and writes bench.csv with every row."""

import pandas as pd
import pytest

from servelab import bench
from servelab.engine.bench.offline import offline_floor_s
from servelab.engine.bench.workload import offline_workload
from servelab.measure import Roofline
from servelab.models import ModelShape, load_model
from servelab.profiles import ParameterError


def test_smoke_bench_writes_every_row(scratch_results, capsys):
    assert bench.main(["--smoke", "--num-requests", "4"]) == 0
    df = pd.read_csv(next(scratch_results.glob("*/engine/bench.csv")))
    assert list(df.columns[:3]) == ["metric", "value", "unit"]
    assert set(df["metric"]) == {"decode_ms_b1_ctx16", "decode_ms_b4_ctx32", "offline_tok_s", "hf_offline_tok_s",
                                 "engine_speedup_vs_hf", "prefill_mfu_128"}
    assert df.set_index("metric").loc[["decode_ms_b1_ctx16", "offline_tok_s"], "value"].gt(0).all()
    exact = pd.read_csv(next(scratch_results.glob("*/engine/exactness.csv")))
    assert exact["all_agree"].all() and exact["logit_max_abs_err"].max() < 1e-3  # float32: identical tokens
    assert (exact["tf_argmax_agree_frac"] == 1).all() and exact["tf_logit_max_abs_err"].max() < 1e-3
    decode = pd.read_csv(next(scratch_results.glob("*/engine/decode.csv")))
    assert {"engine_gather", "hf_eager"} <= set(decode["impl"]) and (decode["status"] == "ok").all()
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
    decode = [roof.floor_ms(shape.decode_flops(1, 10 + k), shape.decode_bytes(1, 10 + k - 1, 2) +
                            shape.kv_bytes_per_token(2)) for k in range(1, 10)]
    expected = float(roof.compute_ms(flops)) / 1e3 + sum(float(d) for d in decode) / 1e3
    assert offline_floor_s(shape, one, roof) == pytest.approx(expected, rel=1e-6)


def test_decode_plot_draws_every_implementation_and_the_floor():
    import matplotlib

    matplotlib.use("Agg")
    from servelab.engine.bench.plots import plot_decode_steps

    df = pd.DataFrame([{"impl": i, "batch": b, "context": c, "median_ms": m, "floor_ms": 0.2, "status": "ok"}
                       for i, m in (("hf_eager", 60.0), ("engine_triton", 0.9)) for b, c in ((1, 128), (64, 512))])
    ax = plot_decode_steps(df)
    labels = ax.get_legend_handles_labels()[1]
    assert {"hf_eager", "engine_triton", "roofline floor"} <= set(labels)
    assert ax.get_yscale() == "log" and "ms" in ax.get_ylabel()
