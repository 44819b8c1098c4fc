"""F5.1–F5.3 verdicts and the recommendation table, from synthetic sweep rows with known answers."""

import pandas as pd
import pytest

from servelab.studies.s05_attention import recommend, tables, verdicts


def _rows(times: dict, lengths=(256, 2048, 8192), configs=(("m1", 64), ("m2", 128)), mem=None):
    """times[variant](L, head_dim) → ms; peak memory from mem[variant](L) (bytes)."""
    rows = []
    for arch, d in configs:
        for L in lengths:
            for var, f in times.items():
                t = f(L, d)
                rows.append(
                    dict(
                        arch=arch,
                        head_dim=d,
                        heads=4,
                        kv_heads=2,
                        batch=1,
                        q_len=L,
                        kv_len=L,
                        mask="causal",
                        mask_label="causal",
                        variant=var,
                        backend="cudnn" if "sdpa" in var else "",
                        status="ok" if t is not None else "oom",
                        median_ms=t,
                        p25_ms=t,
                        p75_ms=t,
                        rel_error=1e-3,
                        tolerance=2e-2,
                        pct_of_floor=50.0,
                        peak_mem_bytes=(mem or {}).get(var, lambda L: L)(L),
                        peak_mem_incl_inputs_bytes=(mem or {}).get(var, lambda L: L)(L) + L,
                    )
                )
    return pd.DataFrame(rows)


def test_f51_verdicts_follow_the_rule():
    for speed, verdict in [(7.0, "holds"), (30.0, "changes"), (0.8, "fails")]:
        df = _rows({"naive": lambda L, d, s=speed: 1.0 * s, "sdpa_default": lambda L, d: 1.0})
        row = verdicts.f51(df, ("m1", 64))
        assert row.verdict == verdict and float(row.measured_value) == pytest.approx(speed)
        assert row.headline == pytest.approx(speed) and "naive / SDPA default" in row.headline_unit
        # the shapes it was judged on: the primary configuration's head layout only, random inputs
        assert row.tested_on.startswith("attention alone at m1 heads (") and "D=64" in row.tested_on
        assert "m2" not in row.tested_on and "random" in row.tested_on


def test_f51_without_data_says_what_is_missing():
    df = _rows({"sdpa_default": lambda L, d: 1.0})
    with pytest.raises(ValueError, match="naive"):
        verdicts.f51(df, ("m1", 64))
    rows, problems = verdicts.findings(df, ("m1", 64), [[256, 8192]])
    assert problems and all(r.id != "F5.1" for r in rows)


def test_f52_growth_and_verdict():
    df = _rows(
        {"naive": lambda L, d: 1.0, "sdpa_default": lambda L, d: 1.0},
        mem={"naive": lambda L: L * L, "sdpa_default": lambda L: 10 * L},
    )
    g = verdicts.memory_growth(df, [[256, 8192]])
    naive = g[(g["variant"] == "naive") & (g["arch"] == "m1")].iloc[0]
    assert naive["growth_working"] == pytest.approx(1024)
    row = verdicts.f52(g, ("m1", 64))
    assert row.verdict == "changes"  # direction holds, magnitudes far from 25× / 2.4×
    assert row.headline == pytest.approx(float(row.measured_value.split("×")[0]), rel=0.05) and row.headline > 25 * 2
    exps = verdicts.growth_exponents(df).set_index(["arch", "variant"])
    assert exps.loc[("m1", "naive"), "exponent"] == pytest.approx(2.0)
    assert exps.loc[("m1", "sdpa_default"), "exponent"] == pytest.approx(1.0)
    flat = _rows(
        {"naive": lambda L, d: 1.0, "sdpa_default": lambda L, d: 1.0},
        mem={"naive": lambda L: 5, "sdpa_default": lambda L: L},
    )
    assert verdicts.f52(verdicts.memory_growth(flat, [[256, 8192]]), ("m1", 64)).verdict == "fails"


def test_f53_compares_kernel_and_architecture_spreads_where_all_ran():
    # naive runs out of memory at 8192: the comparison falls back to 2048, where every kernel ran
    big_kernel_gap = {
        "naive": lambda L, d: None if L > 2048 else 50.0 * d / 64,
        "sdpa_flash": lambda L, d: 1.0 * d / 64,
        "sdpa_default": lambda L, d: 1.0 * d / 64,
    }
    df = _rows(big_kernel_gap)
    assert verdicts.comparison_length(df) == 2048
    sp = verdicts.spreads(df)
    assert set(sp["fixed"]) >= {"naive", "sdpa_flash"} and "sdpa_default" not in set(sp["fixed"])
    holds = verdicts.f53(sp)
    assert holds.verdict == "holds" and holds.headline > 1  # every kernel spread above every architecture spread
    small_kernel_gap = {"naive": lambda L, d: 1.2 * d, "sdpa_flash": lambda L, d: 1.0 * d}
    assert verdicts.f53(verdicts.spreads(_rows(small_kernel_gap))).verdict == "fails"


def test_recommendation_picks_the_fastest_that_ran_everywhere():
    df = _rows(
        {
            "naive": lambda L, d: 10.0,
            "sdpa_flash": lambda L, d: 2.0,
            "sdpa_cudnn": lambda L, d: 1.0 if L < 8192 else None,
        }
    )
    table = recommend.recommend({"all": df})
    row = table.iloc[0]
    assert row["recommended"] == "sdpa_flash"  # cuDNN is faster but failed at 8192
    assert "sdpa_cudnn" in row["not_everywhere"]
    # naive against the best at each shape: 10× where cuDNN ran (1 ms), 5× where only flash did (2 ms)
    assert row["naive_slowdown"] == pytest.approx((10 * 10 * 5) ** (1 / 3))


def test_report_tables():
    df = _rows(
        {
            "naive": lambda L, d: None if L > 2048 else 5.0,
            "sdpa_default": lambda L, d: 1.0,
            "sdpa_repeat_kv": lambda L, d: 2.0,
        }
    )
    fails = tables.first_failures(df)
    assert set(fails["first_failure_len"]) == {8192} and set(fails["longest_ok_len"]) == {2048}
    g = tables.gqa_comparison(df)
    assert (g["repeat_over_gqa"] == 2.0).all()
    out = tables.outcomes(df).set_index("variant")
    assert out.loc["naive", "oom"] == 2 and out.loc["naive", "ok"] == 4


def test_shapes_over_a_budget_do_not_block_a_recommendation():
    df = _rows({"naive": lambda L, d: 10.0, "sdpa_flash": lambda L, d: 2.0})
    skipped = df.iloc[:2].assign(q_len=10**6, kv_len=10**6, status="skipped", median_ms=None)
    table = recommend.recommend({"all": pd.concat([df, skipped])})
    assert table.iloc[0]["recommended"] == "sdpa_flash" and table.iloc[0]["shapes"] == 6
