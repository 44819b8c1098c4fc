import numpy as np
import pandas as pd
import pytest

from servelab.costs import CostModel, decode_points, prefill_points, step_sweep
from servelab.costs.cost_model import fit_all
from servelab.costs.params import study_params
from servelab.costs import verdicts
from servelab.measure import Roofline
from servelab.models import load_model
from servelab.profiles import ParameterError


def test_points_respect_their_caps():
    pts = prefill_points([16, 64, 256], [1, 4], max_batch_tokens=256)
    assert {(p.batch, p.new_tokens) for p in pts} == {(1, 16), (1, 64), (1, 256), (4, 16), (4, 64)}
    dec = decode_points([1, 8], [128, 1024], max_kv_tokens=2048)
    assert {(p.batch, p.context) for p in dec} == {(1, 128), (1, 1024), (8, 128)}
    assert all(p.new_tokens == 1 and p.phase == "decode" for p in dec)


def test_step_sweep_on_cpu_gives_floor_and_percent():
    m = load_model("config:tiny-llama").model
    roof = Roofline(matmul_tflop_s=0.1, copy_gb_s=10.0)
    df = step_sweep(m, "tiny", prefill_points([8], [1], 64) + decode_points([2], [16], 64), ["hf_eager"], roof,
                    warmup=1, repeats=2)
    assert (df["status"] == "ok").all()
    assert (df["floor_ms"] > 0).all() and (df["pct_of_floor"] > 0).all()
    assert df.loc[df.phase == "decode", "us_per_token"].iloc[0] == pytest.approx(
        df.loc[df.phase == "decode", "median_ms"].iloc[0] * 1e3 / 2)


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
    rows = [dict(model="m", mode="hf_eager", phase="prefill", batch=1, new_tokens=n, context=0, status="ok",
                 us_per_token=prefill_us, pct_of_floor=60.0, median_ms=prefill_us * n / 1e3) for n in (1024, 4096, 8192)]
    for c, t in decode_ms_by_ctx.items():
        rows.append(dict(model="m", mode="hf_eager", phase="decode", batch=1, new_tokens=1, context=c, status="ok",
                         median_ms=t, us_per_token=t * 1e3, pct_of_floor=100 * floor_ms / t))
        rows.append(dict(model="m", mode="hf_cuda_graph", phase="decode", batch=64, new_tokens=1, context=c,
                         status="ok", median_ms=t, us_per_token=t * 1e3 / 64, pct_of_floor=50.0))
    return pd.DataFrame(rows)


def test_verdicts_follow_their_rules():
    seedlike = _verdict_frame(prefill_us=50.0, decode_ms_by_ctx={128: 6.0, 4096: 6.1}, floor_ms=5.0)
    assert verdicts.f21_prefill(seedlike)["verdict"] == "holds"
    assert verdicts.f22_decode(seedlike)["verdict"] == "holds"
    assert verdicts.f23_sim_defaults(seedlike)["verdict"] == "holds"
    h200like = _verdict_frame(prefill_us=3.0, decode_ms_by_ctx={128: 60.0, 4096: 61.0}, floor_ms=0.3)
    assert verdicts.f21_prefill(h200like)["verdict"] == "changes"
    assert verdicts.f22_decode(h200like)["verdict"] == "fails"  # flat, but 200x off the memory floor
    assert "launch" in verdicts.f22_decode(h200like)["note"]
    assert verdicts.f23_sim_defaults(h200like)["verdict"] == "changes"
    rows = verdicts.findings(h200like)
    assert [r["id"] for r in rows] == ["F2.1", "F2.2", "F2.3"]


def test_study_params_validate():
    p = study_params("smoke")
    assert p["profile"] == "smoke" and p["modes"] == ["hf_eager"]
    assert study_params("smoke", decode_batches=[4, 1, 4])["decode_batches"] == [1, 4]
    for bad in (dict(profile="fast"), dict(dtype="int8"), dict(modes=["warp"]), dict(prefill_lengths=[0]),
                dict(repeats=-1), dict(models=["config:nope"]), dict(models=[]), dict(modes=["hf_cuda_graph"])):
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
