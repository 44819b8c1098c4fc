"""Study 4's measuring pieces on CPU: bytes/token, capacity, compaction sweep, decode variation, overlap, verdicts."""

import numpy as np
import pandas as pd
import pytest
import torch

from servelab.errors import ParameterError
from servelab.kv.compaction import plan_compaction
from servelab.studies.s04_kv_cache import verdicts
from servelab.studies.s04_kv_cache.bytes_per_token import KVGeometry, bytes_per_token_table, model_config
from servelab.studies.s04_kv_cache.capacity import (
    LengthDistribution,
    capacity_table,
    contiguous_fill,
    fixed_length_capacity,
    paged_fill,
)
from servelab.studies.s04_kv_cache.compaction_bench import compaction_sweep, fragmented_manager
from servelab.studies.s04_kv_cache.derived import mover_ratio, overlap_summary, variation_summary
from servelab.studies.s04_kv_cache.overlap import OverlapRig, overlap_experiment
from servelab.studies.s04_kv_cache.params import study_params


# ---- F4.1 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, attention, per_token_fp16",
    [
        ("config:gpt2", "MHA", 36 * 1024),  # the seed's 36 KB/token
        ("config:qwen2-0.5b", "GQA", 2 * 24 * 2 * 64 * 2),
        ("config:llama-3-8b", "GQA", 2 * 32 * 8 * 128 * 2),
        ("config:gpt-bigcode-santacoder", "MQA", 2 * 24 * 1 * 128 * 2),
    ],
)
def test_geometry_formula_for_full_configs(spec, attention, per_token_fp16):
    g = KVGeometry.from_config(model_config(spec))
    assert g.attention == attention
    assert g.kv_bytes_per_token(2) == per_token_fp16


def test_hf_cache_and_pool_match_formula_on_tiny_models():
    cases = [
        ("config:tiny-qwen2", "float32", True),
        ("config:tiny-gpt-bigcode", "float32", True),
        ("config:gpt2", "float16", False),
    ]
    df = bytes_per_token_table(cases, "cpu", batch=2, tokens=8, pool_blocks=2, block_size=4)
    assert (df["status"] == "ok").all()
    assert df["exact"].all()
    hf = df[df["hf_checked"]]
    assert (hf["hf_bytes_per_token"] == hf["formula_bytes"]).all()
    assert (hf["cached_tokens"] == 16).all()
    assert df.loc[df.model == "config:gpt2", "pool_bytes_per_token"].item() == 36864
    row = verdicts.f41(df)
    assert row.verdict == "holds" and "36,864" in row.measured_value


def test_f41_changes_when_a_measurement_disagrees():
    df = bytes_per_token_table([("config:tiny-qwen2", "float32", True)], "cpu", tokens=4, pool_blocks=1, block_size=4)
    df.loc[0, "exact"] = False
    assert verdicts.f41(df).verdict == "changes"


def test_failed_case_is_a_row_not_an_exception():
    df = bytes_per_token_table([("/nonexistent/model", "float32", True)], "cpu")
    assert df["status"].iloc[0].startswith("error")
    assert verdicts.f41(df).verdict == "fails"


# ---- capacity -----------------------------------------------------------------------------------------
def test_contiguous_and_paged_fill_count_by_hand():
    lengths = np.array([10, 20, 5, 40, 7] * 10)
    c = contiguous_fill(lengths, budget_tokens=200, max_len=64)
    assert c["sequences"] == 3 and c["tokens_stored"] == 35 and c["slots_reserved"] == 192
    p = paged_fill(lengths, num_blocks=10, block_size=8)
    # 10→2 blocks, 20→3, 5→1, 40→5 would need 11 in all: stops after three sequences (6 blocks)
    assert p["sequences"] == 3 and p["tokens_stored"] == 35 and p["slots_reserved"] == 48


def test_capacity_table_paged_beats_contiguous_and_small_blocks_waste_least():
    dist = LengthDistribution(max_len=2048)
    df = capacity_table(32 * 1024, 2**30, dist, [16, 256], trials=2, seed=1)
    med = df.groupby(["layout", "block_size"])[["sequences", "fragmentation_pct"]].median()
    assert med.loc[("paged", 16), "sequences"] > med.loc[("contiguous", 2048), "sequences"]
    assert med.loc[("paged", 16), "fragmentation_pct"] < med.loc[("paged", 256), "fragmentation_pct"]
    assert (df["fragmentation_pct"].between(0, 100)).all()


def test_length_distribution_respects_max_len_and_rejects_bad_parameters():
    p, o = LengthDistribution(max_len=100).sample(5000, np.random.default_rng(0))
    assert (p >= 1).all() and (o >= 1).all() and (p + o <= 100).all()
    with pytest.raises(ValueError):
        LengthDistribution(prompt_sigma=0)
    with pytest.raises(ValueError):
        LengthDistribution(max_len=1)


def test_fixed_length_capacity():
    df = fixed_length_capacity(1024, 1024 * 4096, [100, 4096], max_len=4096, block_size=16)
    got = {(r.length, r.layout.split()[0]): r.sequences for r in df.itertuples()}
    assert got[(100, "contiguous")] == 1 and got[(100, "paged")] == 256 // 7
    assert got[(4096, "paged")] == 1
    with pytest.raises(ValueError):
        fixed_length_capacity(1024, 1024 * 4096, [5000], max_len=4096, block_size=16)


# ---- F4.3 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("frac", [0.0, 0.2, 1.0])
def test_fragmented_manager_needs_exactly_the_requested_moves(frac):
    bm = fragmented_manager(100, 4, 0.4, frac, np.random.default_rng(0))
    plan = plan_compaction(bm)
    assert plan.live == 40 and plan.moved == round(40 * frac)


def test_fragmented_manager_refuses_impossible_states():
    with pytest.raises(ValueError, match="cannot move"):
        fragmented_manager(10, 4, 0.8, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        fragmented_manager(10, 4, 1.0, 0.5, np.random.default_rng(0))


def test_compaction_sweep_rows_and_bandwidth():
    df = compaction_sweep(
        2,
        2,
        8,
        torch.float32,
        "cpu",
        block_sizes=[4, 16],
        pool_mib=[1],
        move_fractions=[0.5],
        copy_gb_s=10.0,
        repeats=2,
        warmup=1,
    )
    assert len(df) == 6 and (df["status"] == "ok").all()
    assert (df["gb_s"] > 0).all()
    # bandwidth = read + write of the moved bytes over the median time
    r = df.iloc[0]
    assert r["gb_s"] == pytest.approx(2 * r["bytes_moved"] / (r["median_ms"] * 1e-3) / 1e9)
    assert set(df.loc[df.method.str.startswith("gather_scatter"), "kernel_launches"]) == {2}
    assert (
        df.loc[df.method == "block_loop", "kernel_launches"] == df.loc[df.method == "block_loop", "blocks_moved"]
    ).all()
    assert len(mover_ratio(df)) == 2
    assert len(mover_ratio(df, "gather_scatter", "gather_scatter_wide")) == 2
    assert mover_ratio(df, "block_loop", "memcpy").empty
    assert verdicts.f43(df, 10.0).verdict in {"holds", "changes"}


def test_compaction_sweep_records_a_pool_too_small():
    df = compaction_sweep(2, 2, 8, torch.float32, "cpu", block_sizes=[4096], pool_mib=[1], move_fractions=[0.5])
    assert df["status"].iloc[0].startswith("skipped")


def test_f43_verdicts():
    base = dict(status="ok", method="gather_scatter", pool_mib=1024, block_size=16)
    assert verdicts.f43(pd.DataFrame([dict(base, gb_s=50.0)]), 400).verdict == "holds"
    assert verdicts.f43(pd.DataFrame([dict(base, gb_s=2000.0)]), 4000).verdict == "changes"


# ---- F4.2 ---------------------------------------------------------------------------------------------
def _steps(mode, batch, kv_gb_s, fixed_ms, floor_pct):
    ctx = np.array([128, 256, 512, 1024])
    kv = batch * ctx * 36864.0
    ms = fixed_ms + kv / (kv_gb_s * 1e9) * 1e3
    return pd.DataFrame(
        dict(
            model="m",
            mode=mode,
            batch=batch,
            context=ctx,
            kv_bytes=kv,
            bytes=kv + 2.5e8,
            median_ms=ms,
            status="ok",
            achieved_gb_s=(kv + 2.5e8) / (ms * 1e-3) / 1e9,
            pct_of_floor=floor_pct,
        )
    )


def test_variation_summary_recovers_marginal_bandwidth():
    s = variation_summary(_steps("hf_cuda_graph", 64, kv_gb_s=3000.0, fixed_ms=0.3, floor_pct=60))
    assert s["marginal_kv_gb_s"].item() == pytest.approx(3000.0, rel=1e-6)
    assert s["fit_r2"].item() == pytest.approx(1.0)
    assert s["variation_pct"].item() > 100


def test_f42_verdicts_by_regime():
    flat_launch = _steps("hf_eager", 1, kv_gb_s=3000.0, fixed_ms=60.0, floor_pct=0.5)
    grows = _steps("hf_cuda_graph", 64, kv_gb_s=3000.0, fixed_ms=0.3, floor_pct=60)
    flat_mem = _steps("hf_cuda_graph", 1, kv_gb_s=1e9, fixed_ms=1.0, floor_pct=80)
    assert verdicts.f42(variation_summary(pd.concat([flat_launch, grows])), 4000).verdict == "changes"
    assert verdicts.f42(variation_summary(grows), 4000).verdict == "fails"
    assert verdicts.f42(variation_summary(flat_mem), 4000).verdict == "holds"


# ---- F4.4 ---------------------------------------------------------------------------------------------
def test_overlap_rig_on_cpu_runs_three_conditions():
    calls = {"d": 0, "c": 0}
    rig = OverlapRig(
        lambda: calls.__setitem__("d", calls["d"] + 1),
        lambda: calls.__setitem__("c", calls["c"] + 1),
        decode_steps=3,
        device="cpu",
    )
    runs = overlap_experiment(rig, rounds=4, warmup_rounds=0)
    assert set(runs["condition"]) == {"compaction_alone", "decode_alone", "serialised"}
    assert calls == {"d": 3 * 4 * 2, "c": 4 * 2}
    assert runs.loc[runs.condition == "decode_alone", "compaction_ms"].isna().all()
    with pytest.raises(ValueError):
        rig.run("concurrent")
    with pytest.raises(ValueError):
        OverlapRig(lambda: None, lambda: None, decode_steps=0, device="cpu")
    assert verdicts.f44(overlap_summary(runs), on_cuda=False).verdict == "fails"


def _runs(c_alone, c_conc, d=2.0, rounds=30, seed=0):
    rng = np.random.default_rng(seed)
    n = lambda m: m * (1 + 0.01 * rng.standard_normal(rounds))  # noqa: E731
    rows = []
    for r in range(rounds):
        ca, cc, da, dc = n(c_alone)[r], n(c_conc)[r], n(d)[r], n(d)[r]
        rows += [
            dict(round=r, condition="compaction_alone", compaction_ms=ca, decode_ms=np.nan, total_ms=ca),
            dict(round=r, condition="decode_alone", compaction_ms=np.nan, decode_ms=da, total_ms=da),
            dict(round=r, condition="serialised", compaction_ms=ca, decode_ms=da, total_ms=ca + da),
            dict(round=r, condition="concurrent", compaction_ms=cc, decode_ms=dc, total_ms=max(cc, dc)),
        ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("c_conc, verdict", [(2.0 / 1.3, "holds"), (2.0 / 1.05, "changes"), (2.6, "fails")])
def test_f44_verdicts(c_conc, verdict):
    s = overlap_summary(_runs(2.0, c_conc))
    assert s["compaction_speedup"] == pytest.approx(2.0 / c_conc, rel=0.02)
    assert s["compaction_speedup_ci_low"] <= s["compaction_speedup"] <= s["compaction_speedup_ci_high"]
    assert verdicts.f44(s, on_cuda=True).verdict == verdict


def test_f44_over_several_regimes_needs_all_for_holds():
    fast = dict(overlap_summary(_runs(2.0, 2.0 / 1.3)), decode_batch=1, decode_mode="hf_cuda_graph")
    slow = dict(overlap_summary(_runs(2.0, 2.6, seed=1)), decode_batch=64, decode_mode="hf_cuda_graph")
    row = verdicts.f44(pd.DataFrame([fast, slow]), on_cuda=True)
    assert row.verdict == "changes"
    assert row.headline == pytest.approx((fast["compaction_speedup"] + slow["compaction_speedup"]) / 2)  # median
    assert "median over 2 regimes" in row.headline_unit
    assert "decode batch 1 (HF CUDA graph)" in row.note and "decode batch 64" in row.note  # the page's words
    assert verdicts.f44(pd.DataFrame([fast, fast]), on_cuda=True).verdict == "holds"


def test_overlap_summary_wall_saving():
    s = overlap_summary(_runs(2.0, 2.0, d=2.0))
    assert s["wall_saving_pct"] == pytest.approx(50, abs=2)  # serialised 4 ms, overlapped 2 ms
    assert s["overlap_pct"] == pytest.approx(100, abs=4)
    assert "prioritised_wall_saving_pct" not in s


def test_overlap_summary_prioritised_condition():
    runs = _runs(2.0, 2.0, d=2.0)
    prio = runs[runs.condition == "concurrent"].assign(
        condition="concurrent_prioritised", compaction_ms=3.0, decode_ms=2.2, total_ms=3.0
    )
    s = overlap_summary(pd.concat([runs, prio], ignore_index=True))
    assert s["prioritised_decode_slowdown"] == pytest.approx(1.1, rel=0.02)
    assert s["prioritised_wall_saving_pct"] == pytest.approx(25, abs=1)  # 3 ms against 4 serialised
    assert s["prioritised_wall_saving_ci_low_pct"] <= 25 + 1e-9 <= s["prioritised_wall_saving_ci_high_pct"] + 1
    note = verdicts.f44(pd.DataFrame([dict(s, decode_batch=1)]), on_cuda=True).note
    assert "high-priority stream: decode 1.10×" in note


# ---- parameters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        dict(repeats=0),
        dict(block_sizes=[]),
        dict(block_sizes=[0]),
        dict(decode_contexts=[64]),
        dict(decode_contexts=[64, 4096]),  # past GPT-2's 1,024 positions (tiny-gpt2 has 1,024 too)
        dict(compaction_move_fractions=[0]),
        dict(compaction_methods=["memcpy"]),
        dict(bpt_cases=[["config:gpt2", "int8", True]]),
        dict(bpt_cases=[["config:gpt2", "float16"]]),
        dict(capacity_model="config:nope"),
        dict(unknown=1),
        dict(decode_modes=["hf_cuda_graph"]) if not torch.cuda.is_available() else dict(decode_modes=["warp"]),
    ],
)
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ParameterError):
        study_params("smoke", **bad)


def test_profiles_resolve():
    p = study_params("smoke")
    assert p["profile"] == "smoke" and p["decode_model"] == "config:tiny-gpt2"
    full = study_params("full", decode_modes=["hf_eager"])
    assert full["decode_model"] == "config:gpt2" and max(full["decode_contexts"]) < 1024


def test_f42_flat_but_far_from_floor_changes():
    launch_bound = _steps("hf_eager", 1, kv_gb_s=3000.0, fixed_ms=60.0, floor_pct=0.5)
    row = verdicts.f42(variation_summary(launch_bound), 4000)
    assert row.verdict == "changes" and "never near the memory floor" in row.note


def test_compaction_sweep_skips_points_with_nothing_to_move():
    df = compaction_sweep(
        2, 2, 8, torch.float32, "cpu", block_sizes=[4], pool_mib=[1], move_fractions=[0.0001], repeats=1, warmup=0
    )
    assert (df["status"] == "skipped: no block to move").all()


@pytest.mark.gpu
def test_overlap_rig_on_cuda_times_all_four_conditions():
    a = torch.randn(1 << 20, device="cuda")
    b = torch.empty_like(a)
    rig = OverlapRig(lambda: torch.mul(a, 2.0, out=b), lambda: b.copy_(a), decode_steps=2, device="cuda")
    runs = overlap_experiment(rig, rounds=3, warmup_rounds=1)
    assert set(runs["condition"]) == set(rig.conditions) and len(rig.conditions) == 5
    conc = runs[runs.condition == "concurrent"]
    assert (conc["compaction_ms"] > 0).all() and (conc["decode_ms"] > 0).all()
    assert (conc["total_ms"] >= conc[["compaction_ms", "decode_ms"]].max(axis=1) * 0.99).all()


def test_cold_start_effect_rows_on_cpu():
    from servelab.studies.s04_kv_cache.overlap_probes import cold_start_effect

    rig = OverlapRig(lambda: None, lambda: sum(range(1000)), decode_steps=1, device="cpu")
    df = cold_start_effect(rig, idle_s=0.0, samples=2, warm_runs=3)
    assert list(df["state"]) == ["cold", "cold", "warm", "warm"]
    assert (df["compaction_ms"] > 0).all()
    with pytest.raises(ValueError):
        cold_start_effect(rig, samples=5, warm_runs=2)


def test_kernel_comparison_subtracts_the_decodes_share(monkeypatch):
    """Compaction kernels during decode: the same-named kernel's decode share is taken out (profiler faked)."""
    from servelab.measure import kernel_profile
    from servelab.measure.kernel_profile import KernelProfile
    from servelab.studies.s04_kv_cache import overlap_probes

    tops = {
        "compaction_alone": [("indexSelect", 1, 100.0), ("indexCopy", 1, 100.0)],
        "decode_alone": [("indexSelect", 1, 5.0), ("gemm", 10, 500.0)],
        "serialised": [("indexSelect", 2, 105.0), ("indexCopy", 1, 100.0), ("gemm", 10, 500.0)],
        "concurrent": [("indexSelect", 2, 135.0), ("indexCopy", 1, 120.0), ("gemm", 10, 520.0)],
    }

    class FakeRig:
        current = None
        conditions = tuple(tops)

        def run(self, c):
            FakeRig.current = c

    def fake_profile_call(fn, **kw):
        fn()
        top = tops[FakeRig.current]
        return KernelProfile(
            wall_ms=1.0,
            kernels=sum(n for _, n, _ in top),
            gpu_busy_ms=0.5,
            gpu_busy_pct=50.0,
            cpu_us_per_launch=1.0,
            top_kernels=top,
        )

    monkeypatch.setattr(kernel_profile, "profile_call", fake_profile_call)
    df = overlap_probes.kernel_comparison(FakeRig())
    k = df.set_index("kernel")
    assert k.loc["indexSelect", "during_decode_us"] == pytest.approx(130.0)
    assert k.loc["indexSelect", "shared_with_decode"]
    assert k.loc["indexCopy", "during_decode_ratio"] == pytest.approx(1.2)
    assert "during_prioritised_decode_us" not in k.columns  # that condition was not run
    assert "gemm" not in k.index and "[all kernels, concurrent]" in k.index


def test_clocks_by_condition_samples_each_condition(monkeypatch):
    from servelab.measure import device
    from servelab.studies.s04_kv_cache import overlap_probes

    monkeypatch.setattr(device, "read_clocks", lambda: {"clocks.sm": "1980", "clocks.mem": "3201"})
    rig = OverlapRig(lambda: None, lambda: None, decode_steps=1, device="cpu")
    df = overlap_probes.clocks_by_condition(rig, seconds=0.05)
    assert list(df["condition"]) == list(rig.conditions)
    assert (df["clocks.sm"] == "1980").all() and (df["calls"] > 0).all()


def test_findings_say_what_they_were_tested_on():
    bpt = pd.DataFrame(
        [
            dict(model="config:gpt2", attention="MHA", dtype="float16", layers=12, kv_heads=12, head_dim=64,
                 dtype_bytes=2, pool_bytes_per_token=36864, exact=True, status="ok"),
            dict(model="Org/ckpt", attention="GQA", dtype="bfloat16", layers=2, kv_heads=2, head_dim=8,
                 dtype_bytes=2, pool_bytes_per_token=128, exact=True, status="ok"),
        ]
    )  # fmt: skip
    var = pd.DataFrame([dict(model="config:gpt2", mode="hf_eager", batch=b, trend_pct=1.0, variation_pct=2.0,
                             pct_of_floor_at_max_context=80.0, marginal_kv_gb_s=np.nan) for b in (64, 1)])  # fmt: skip
    comp = pd.DataFrame([dict(status="ok", method="gather_scatter", pool_mib=m, block_size=16, gb_s=50.0)
                         for m in (4096, 1024)])  # fmt: skip
    f41, f42, f43, f44 = verdicts.findings(
        bpt, var, comp, pd.DataFrame(), copy_gb_s=4000.0, on_cuda=False, model="config:gpt2", dtype="float16"
    )
    assert f41.tested_on == (
        "gpt2 (architecture-exact, random weights); Org/ckpt (trained weights); dtypes float16, bfloat16"
    )
    assert f42.tested_on == "gpt2 (architecture-exact, random weights; float16); decode, HF eager; batches 1, 64"
    assert f43.tested_on.endswith("KV pools of 1,024, 4,096 MiB, 16-token blocks")
    assert f44.tested_on == ""  # a CPU run measured nothing to name
    # each headline is the number its rule decides on; a CPU run's F4.4 measured none
    assert f41.headline == 100.0 and f42.headline == 1.0 and f43.headline == 50.0 and f44.headline is None
    assert all(f.headline_unit for f in (f41, f42, f43)) and f44.headline_unit == ""


def test_f44s_percentages_never_read_minus_zero():
    assert verdicts._pct(-0.04) == "0" and verdicts._pct(-0.2) == "-0.2" and verdicts._pct(0.24, signed=True) == "+0.2"
    assert verdicts._pct(25.4, signed=True) == "+25"


def test_f42_says_when_a_marginal_read_is_above_the_copy_ceiling():
    grows = _steps("hf_cuda_graph", 64, kv_gb_s=3000.0, fixed_ms=0.3, floor_pct=60)
    flat = _steps("hf_eager", 1, kv_gb_s=3000.0, fixed_ms=60.0, floor_pct=0.5)
    s = variation_summary(pd.concat([flat, grows]))
    assert "over-states" in verdicts.f42(s, 2000).note and "over-states" not in verdicts.f42(s, 4000).note


def test_f43_names_the_movers_as_the_page_defines_them():
    # 2026-12 audit: the note read "block_loop: 18–911 GB/s … gather_scatter_wide", identifiers the page never
    # defines; its F4.3 section names them the naive per-block loop, gather/scatter and wide gather/scatter
    comp = pd.DataFrame(
        [dict(status="ok", method=m, pool_mib=1024, block_size=bs, gb_s=gb) for m, bs, gb in
         (("block_loop", 16, 30.0), ("block_loop", 256, 900.0), ("gather_scatter", 16, 600.0),
          ("gather_scatter_wide", 16, 1800.0))]
    )  # fmt: skip
    f = verdicts.f43(comp, 4000.0, "config:gpt2", "float16")
    assert f.verdict == "changes" and "block_loop" not in f.note and "gather_scatter" not in f.note
    assert f.note.startswith("naive per-block loop: 30–900 GB/s") and "; wide gather/scatter: 1,800–1,800" in f.note
    assert f.note.endswith("The seed's 19–67 GB/s is what this GPU moves with the naive per-block loop with 16-token "
                           "blocks")  # fmt: skip
