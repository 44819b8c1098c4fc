import json

import numpy as np
import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.measure import Roofline
from servelab.models import ModelShape, load_model
from servelab.sim.cost_fit import STEP_TERMS, CostModel, fit_all, heldout_table, step_features
from servelab.studies.s02_gpu_costs import verdicts
from servelab.studies.s02_gpu_costs.launch_overhead import launch_overhead, step_label
from servelab.studies.s02_gpu_costs.params import study_params
from servelab.studies.s02_gpu_costs.points import (
    StepPoint,
    context_prefill_points,
    decode_points,
    mixed_points,
    prefill_points,
    study_plan,
)
from servelab.studies.s02_gpu_costs.sweep import NO_MIXED_STEP, step_sweep, time_steps


def test_points_respect_their_caps():
    pts = prefill_points([16, 64, 256], [1, 4], max_batch_tokens=256)
    assert {(p.batch, p.new_tokens) for p in pts} == {(1, 16), (1, 64), (1, 256), (4, 16), (4, 64)}
    dec = decode_points([1, 8], [128, 1024], max_kv_tokens=2048)
    assert {(p.batch, p.context) for p in dec} == {(1, 128), (1, 1024), (8, 128)}
    assert all(p.new_tokens == 1 and p.phase == "decode" for p in dec)


def test_step_sweep_on_cpu_gives_floor_and_percent():
    m = load_model("config:tiny-llama").model
    roof = Roofline(matmul_tflop_s=0.1, copy_gb_s=10.0)
    df = step_sweep(
        m, "tiny", prefill_points([8], [1], 64) + decode_points([2], [16], 64), ["hf_eager"], roof, warmup=1, repeats=2
    )
    assert (df["status"] == "ok").all()
    assert (df["floor_ms"] > 0).all() and (df["pct_of_floor"] > 0).all()
    assert df.loc[df.phase == "decode", "us_per_token"].iloc[0] == pytest.approx(
        df.loc[df.phase == "decode", "median_ms"].iloc[0] * 1e3 / 2
    )


def test_step_sweep_rejects_unknown_mode():
    m = load_model("config:tiny-llama").model
    with pytest.raises(ValueError, match="unknown mode"):
        step_sweep(m, "tiny", [], ["warp_drive"], Roofline(1, 1))


def _synthetic_steps(a_p=0.5, b_p=0.01, k_p=1e-6, a_d=2.0, b_d=0.05, k_d=1e-4, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for b in (1, 4):
        for n in (64, 256, 1024, 4096):
            t = a_p + b_p * b * n + k_p * b * n * (n / 2)
            rows.append(dict(model="m", mode="x", phase="prefill", batch=b, new_tokens=n, context=0, median_ms=t))
    for b in (1, 8, 64):
        for c in (128, 1024, 8192):
            t = a_d + b_d * b + k_d * b * c
            rows.append(dict(model="m", mode="x", phase="decode", batch=b, new_tokens=1, context=c, median_ms=t))
    df = pd.DataFrame(rows).assign(status="ok")
    df["median_ms"] *= 1 + noise * rng.standard_normal(len(df))
    return df


def test_cost_model_recovers_known_coefficients():
    cm = CostModel.fit(_synthetic_steps(), "m", "x")
    assert cm.prefill["intercept_ms"] == pytest.approx(0.5, rel=1e-6)
    assert cm.prefill["ms_per_token"] == pytest.approx(0.01, rel=1e-6)
    assert cm.decode["ms_per_ctx_token"] == pytest.approx(1e-4, rel=1e-6)
    assert cm.fit_error["decode_max_abs_pct"] < 1e-6
    assert cm.decode_ms(8, 1024)[0] == pytest.approx(2.0 + 0.4 + 1e-4 * 8 * 1024)


def test_cost_model_save_load_and_fit_all(tmp_path):
    steps = _synthetic_steps(noise=0.02)
    models, predicted, summary = fit_all(steps)
    cm = models[("m", "x")]
    assert summary.loc[0, "decode_median_abs_pct"] < 5
    again = CostModel.load(cm.save(tmp_path / "cm.json"))
    assert np.allclose(again.predict(steps), predicted["predicted_ms"])


def test_cost_model_needs_enough_points():
    with pytest.raises(ValueError, match="too few"):
        CostModel.fit(_synthetic_steps().head(3), "m", "x")


def _verdict_frame(prefill_us, decode_ms_by_ctx, floor_ms):
    rows = [("hf_eager", "prefill", 1, n, 0, prefill_us, 60.0, prefill_us * n / 1e3) for n in (1024, 4096, 8192)]
    for c, t in decode_ms_by_ctx.items():
        rows.append(("hf_eager", "decode", 1, 1, c, t * 1e3, 100 * floor_ms / t, t))
        rows.append(("hf_cuda_graph", "decode", 64, 1, c, t * 1e3 / 64, 50.0, t))
    columns = ["mode", "phase", "batch", "new_tokens", "context", "us_per_token", "pct_of_floor", "median_ms"]
    return pd.DataFrame(rows, columns=columns).assign(model="m", status="ok")


def test_verdicts_follow_their_rules():
    seedlike = _verdict_frame(prefill_us=50.0, decode_ms_by_ctx={128: 6.0, 4096: 6.1}, floor_ms=5.0)
    assert verdicts.f21_prefill(seedlike).verdict == "holds"
    assert verdicts.f22_decode(seedlike).verdict == "holds"
    assert verdicts.f23_sim_defaults(seedlike).verdict == "holds"
    h200like = _verdict_frame(prefill_us=3.0, decode_ms_by_ctx={128: 60.0, 4096: 61.0}, floor_ms=0.3)
    assert verdicts.f21_prefill(h200like).verdict == "changes"
    assert verdicts.f22_decode(h200like).verdict == "fails"  # flat, but 200x off the memory floor
    assert "launch" in verdicts.f22_decode(h200like).note
    assert verdicts.f23_sim_defaults(h200like).verdict == "changes"
    rows = verdicts.findings(h200like)
    assert [r.id for r in rows] == ["F2.1", "F2.2", "F2.3"]
    # each headline is the number its rule decides on: prefill µs/token, % of the floor, the seed / H200 ratio
    f21, f22, f23 = rows
    assert f21.headline == pytest.approx(3.0) and f21.headline_unit.startswith("µs/token")
    assert f22.headline < verdicts.LAUNCH_BOUND_PCT and "% of the memory floor" in f22.headline_unit
    assert f23.headline == pytest.approx(50.0 / 3.0) and "× the RTX 2070's" in f23.headline_unit
    assert verdicts.f21_prefill(seedlike).headline == pytest.approx(50.0)


def test_study_params_validate():
    p = study_params("smoke")
    assert p["profile"] == "smoke" and p["modes"] == ["hf_eager", "engine", "engine_eager"]
    assert study_params("smoke", decode_batches=[4, 1, 4])["decode_batches"] == [1, 4]
    for bad in (
        dict(profile="fast"),
        dict(dtype="int8"),
        dict(modes=["warp"]),
        dict(prefill_lengths=[0]),
        dict(repeats=-1),
        dict(models=["config:nope"]),
        dict(models=[]),
        dict(modes=["hf_cuda_graph"]),
    ):
        prof = bad.pop("profile", "smoke")
        with pytest.raises(ParameterError):
            study_params(prof, **bad)
    with pytest.raises(ParameterError, match="unknown parameters"):
        study_params("smoke", batch_size=3)


def test_engine_mode_runs_in_the_same_sweep_as_hf():
    m = load_model("config:tiny-llama").model
    roof = Roofline(matmul_tflop_s=0.1, copy_gb_s=10.0)
    df = step_sweep(m, "tiny", decode_points([2], [16], 64), ["hf_eager", "engine"], roof, warmup=1, repeats=2)
    assert set(df["mode"]) == {"hf_eager", "engine"}
    assert (df["status"] == "ok").all(), df["status"].tolist()


# ---- chunks after context, mixed steps, the step model ---------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(phase="chunk", batch=1, new_tokens=8, context=0),
        dict(phase="decode", batch=1, new_tokens=2, context=8),
        dict(phase="decode", batch=1, new_tokens=1, context=0),
        dict(phase="mixed", batch=2, new_tokens=8, context=0, decodes=4, decode_context=8),
        dict(phase="mixed", batch=1, new_tokens=8, context=0, decodes=0, decode_context=8),
        dict(phase="prefill", batch=1, new_tokens=8, context=0, decodes=4, decode_context=8),
        dict(phase="prefill", batch=0, new_tokens=8, context=0),
        dict(phase="prefill", batch=1, new_tokens=8, context=-3),
    ],
)
def test_step_points_refuse_steps_that_do_not_exist(kw):
    with pytest.raises(ParameterError):
        StepPoint(**kw)


def test_a_mixed_step_costs_its_parts_with_the_weights_read_once():
    shape = ModelShape.from_config(load_model("config:tiny-qwen2").model.config)
    mixed = StepPoint("mixed", 1, 64, 128, decodes=8, decode_context=256)
    flops, nbytes = mixed.work(shape, 2)
    assert flops == pytest.approx(shape.prefill_flops(64, 128, 1) + shape.decode_flops(8, 256))
    assert nbytes == pytest.approx(
        shape.prefill_bytes(64, 128, 1, 2) + shape.decode_bytes(8, 256, 2) - shape.weight_bytes(2)
    )
    assert mixed.tokens == 72
    assert [(p.new_tokens, p.context) for p in context_prefill_points([128, 512], [512])] == [(128, 512), (512, 512)]
    assert {(p.decodes, p.context) for p in mixed_points([16, 64], 512, 512, [0, 1024])} == {
        (16, 0),
        (16, 1024),
        (64, 0),
        (64, 1024),
    }


def test_the_plan_runs_chunks_in_the_engine_modes_and_asks_every_mode_for_mixed_steps():
    plan = study_plan(study_params("smoke"), kv_bytes_per_token=1024)
    by_phase = {}
    for mode, p in plan:
        kind = "chunk" if p.phase == "prefill" and p.context else p.phase
        by_phase.setdefault(kind, set()).add(mode)
    assert by_phase["chunk"] == {"engine", "engine_eager"}
    assert by_phase["mixed"] == by_phase["decode"] == by_phase["prefill"] == {"hf_eager", "engine", "engine_eager"}


def test_sweep_times_server_steps_in_the_engine_and_says_hf_has_no_mixed_step():
    m = load_model("config:tiny-llama").model
    roof = Roofline(matmul_tflop_s=0.1, copy_gb_s=10.0)
    chunk, mixed = StepPoint("prefill", 1, 8, 16), StepPoint("mixed", 1, 8, 16, decodes=2, decode_context=8)
    big = StepPoint("prefill", 1, 64, 0)
    todo = [(mode, p) for mode in ("hf_eager", "engine", "engine_eager") for p in (chunk, mixed, big)]
    df = time_steps(m, "tiny", todo, roof, warmup=1, repeats=2, max_tokens={"engine_eager": 32}).set_index(
        ["mode", "phase", "context", "new_tokens"]
    )
    assert df.loc[("hf_eager", "mixed", 16, 8), "status"] == NO_MIXED_STEP
    assert df.loc[("engine_eager", "prefill", 0, 64), "status"].startswith("skipped")
    ok = df[df["status"] == "ok"]
    assert len(ok) == 7  # HF eager runs the chunk after context too; the eager engine skips the big prefill
    row = df.loc[("engine", "mixed", 16, 8)]
    assert row["decodes"] == 2 and row["us_per_token"] == pytest.approx(row["median_ms"] * 1e3 / 10)
    assert (ok["floor_ms"] > 0).all()
    assert (ok.xs("engine", level="mode")["path"] == "eager").all()  # no graphs on a CPU: the rows say so


def _synthetic_server_steps(coef, noise=0.0, seed=0):
    """Rows of every kind, timed by the step model with ``coef`` (STEP_TERMS order)."""
    rows = []
    for b in (1, 4):
        for n in (64, 256, 1024, 4096):
            rows.append(dict(phase="prefill", batch=b, new_tokens=n, context=0, decodes=0, decode_context=0))
    for n in (128, 512):
        for c in (512, 2048, 8192):
            rows.append(dict(phase="prefill", batch=1, new_tokens=n, context=c, decodes=0, decode_context=0))
    for b in (1, 8, 64):
        for c in (128, 1024, 8192):
            rows.append(dict(phase="decode", batch=b, new_tokens=1, context=c, decodes=0, decode_context=0))
    for d in (16, 64):
        for c in (0, 1024):
            rows.append(dict(phase="mixed", batch=1, new_tokens=512, context=c, decodes=d, decode_context=512))
    df = pd.DataFrame(rows).assign(model="m", mode="engine", status="ok")
    df["median_ms"] = step_features(df) @ np.array(coef)
    df["median_ms"] *= 1 + noise * np.random.default_rng(seed).standard_normal(len(df))
    return df


TRUE_STEP = [0.3, 0.2, 2e-3, 4e-7, 6e-7, 5e-3, 2e-5]


def test_step_model_recovers_known_coefficients_and_holds_out_exactly():
    cm = CostModel.fit(_synthetic_server_steps(TRUE_STEP), "m", "engine")
    for k, v in zip(STEP_TERMS, TRUE_STEP, strict=True):
        assert cm.step[k] == pytest.approx(v, rel=1e-5), k
    assert cm.step_error["heldout_median_abs_pct"] < 1e-6 and cm.step_error["heldout_mixed_median_abs_pct"] < 1e-6
    # a mixed step is a chunk plus decodes, each priced by its own terms
    mixed = pd.DataFrame([dict(phase="mixed", batch=1, new_tokens=512, context=1024, decodes=16, decode_context=512)])
    a, a_chunk, b_p, k_c, k_n, b_d, k_d = TRUE_STEP
    want = a + a_chunk + b_p * 512 + k_c * 512 * 1024 + k_n * 512 * 512 / 2 + b_d * 16 + k_d * 16 * 512
    assert cm.step_ms(mixed)[0] == pytest.approx(want)


def test_step_model_reports_held_out_error_above_its_fit_error_with_noise(tmp_path):
    steps = _synthetic_server_steps(TRUE_STEP, noise=0.05)
    models, predicted, summary = fit_all(steps)
    cm = models[("m", "engine")]
    assert 0 < cm.step_error["fit_median_abs_pct"] < cm.step_error["heldout_median_abs_pct"] < 10
    for phase in ("prefill", "decode"):  # the per-phase models are held out the same way
        assert cm.fit_error[f"{phase}_median_abs_pct"] < cm.fit_error[f"{phase}_heldout_median_abs_pct"] < 15
    table = heldout_table(predicted)
    assert set(table["phase"]) == {"prefill", "decode", "mixed"} and table["rows"].sum() == len(steps)
    assert summary.loc[0, "step_heldout_median_abs_pct"] == pytest.approx(cm.step_error["heldout_median_abs_pct"])
    again = CostModel.load(cm.save(tmp_path / "cm.json"))
    assert again.step == cm.step and np.allclose(again.step_ms(steps), predicted["step_ms"])


def test_cost_model_json_without_the_step_model_still_loads(tmp_path):
    old = {
        "model": "m",
        "mode": "x",
        "prefill": dict.fromkeys(("intercept_ms", "ms_per_token", "ms_per_attn_pair"), 1.0),
        "decode": dict.fromkeys(("intercept_ms", "ms_per_seq", "ms_per_ctx_token"), 1.0),
        "fit_error": {},
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    cm = CostModel.load(tmp_path / "old.json")
    assert cm.step == {} and cm.decode_ms(1, 1)[0] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="no step model"):
        cm.step_ms(_synthetic_server_steps(TRUE_STEP))


def _engine_steps(rows):
    """Steps.csv rows of model ``m`` at batch 1, from tuples in ``columns``' order."""
    columns = ["mode", "phase", "new_tokens", "context", "decodes", "decode_context", "status", "median_ms", "floor_ms"]
    return pd.DataFrame(rows, columns=columns).assign(model="m", batch=1)


def test_launch_overhead_pairs_the_engine_modes_per_step():
    rows = []
    for mode, ms in (("engine", 1.0), ("engine_eager", 4.0), ("hf_eager", 9.0)):
        rows.append((mode, "mixed", 512, 1024, 16, 512, "ok", ms, 0.5))
        rows.append((mode, "decode", 1, 128, 0, 0, "ok" if mode != "engine_eager" else "oom", ms, 0.1))
    steps = _engine_steps(rows)
    t = launch_overhead(steps)
    assert len(t) == 1  # the decode step has no eager time
    r = t.iloc[0]
    assert r["step"] == "mixed 16×512 + 512 after 1024" and r["tokens"] == 528
    assert (r["saved_ms"], r["eager_over_graph"], r["graph_pct_of_floor"]) == (3.0, 4.0, 50.0)
    assert launch_overhead(steps.query("mode == 'hf_eager'")).empty
    assert step_label(dict(phase="prefill", batch=4, new_tokens=64, context=0)) == "prefill 4×64"


def test_new_study_params_validate():
    from servelab.studies.s02_gpu_costs.params import DEFAULTS

    assert "engine_eager" in DEFAULTS["full"]["modes"]
    p = study_params("full", modes=["engine", "engine_eager"])  # no HF CUDA graph on a CPU
    assert p["mixed_chunk_contexts"] == [0, 1024] and p["engine_eager_max_tokens"] == 4096
    for bad in (
        dict(mixed_chunk_contexts=[-1]),
        dict(mixed_chunk_contexts=[]),
        dict(mixed_decode_context=1),
        dict(chunk_contexts=[0]),
        dict(mixed_decodes=[0]),
        dict(engine_eager_max_tokens=0),
    ):
        with pytest.raises(ParameterError):
            study_params("smoke", **bad)


def test_launch_overhead_figure_draws_both_modes_against_the_floor():
    import matplotlib

    matplotlib.use("Agg")
    from servelab.studies.s02_gpu_costs import plots

    rows = [
        (mode, ph, n, 0, d, dc, "ok", ms, 0.2)
        for mode, ms in (("engine", 1.0), ("engine_eager", 20.0))
        for ph, n, d, dc in (("prefill", 64, 0, 0), ("mixed", 64, 8, 128))
    ]
    fig = plots.launch_overhead(launch_overhead(_engine_steps(rows)), "test GPU")
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "roofline floor (100%)" in labels and "mixed, no graphs" in labels
    assert ax.get_xscale() == ax.get_yscale() == "log" and "ms" in ax.get_xlabel() and "ms" in ax.get_ylabel()


def test_findings_say_what_they_were_tested_on():
    steps = _verdict_frame(prefill_us=3.0, decode_ms_by_ctx={128: 60.0, 4096: 61.0}, floor_ms=0.3)
    steps["model"] = "config:qwen2-0.5b"
    f21, f22, f23 = verdicts.findings(steps, dtype="bfloat16")
    assert f21.tested_on.startswith("qwen2-0.5b (architecture-exact, random weights; bfloat16); hf_eager; batch 1")
    assert "contexts 128–4,096 tokens" in f22.tested_on
    assert f23.tested_on.endswith("hf_cuda_graph decode at batch 64, context 128")


def test_f21_reads_every_mode_as_its_rule_says():
    # the rule reads "across models and modes"; the code read HF eager alone until 2026-12-06
    frame = _verdict_frame(prefill_us=3.0, decode_ms_by_ctx={128: 60.0}, floor_ms=0.3)
    graph = frame[frame["phase"] == "prefill"].assign(mode="hf_cuda_graph", us_per_token=4.0, pct_of_floor=45.0)
    chunk = graph.assign(mode="engine", us_per_token=99.0, context=512)  # a chunk after context: not a prompt
    f = verdicts.f21_prefill(pd.concat([graph, frame, chunk], ignore_index=True))
    # HF eager (the seed's mode) first, whatever order the modes ran in
    assert f.measured_value == "3.0–4.0 µs/token over 2 modes (hf_eager 3.0–3.0, hf_cuda_graph 4.0–4.0)"
    assert "engine" not in f.note and f.headline == pytest.approx(3.5)  # the median over (model, mode) pairs
    assert f.headline_unit == "µs/token, prefill at ≥ 4,096 tokens, median over 2 model-mode pairs"
    assert "hf_eager, hf_cuda_graph; batch 1" in f.tested_on
    # a mode inside the seed's band is enough for an overlap: the rule reads the range over every mode
    slow = graph.assign(us_per_token=45.0)
    assert verdicts.f21_prefill(pd.concat([frame, slow], ignore_index=True)).verdict == "holds"
