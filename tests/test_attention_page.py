"""The page's tables, figures and findings survive what a GPU run produces: OOMs, refusals, skips."""

import matplotlib
import numpy as np
import pytest
import torch

from servelab.measure import Roofline, measure_ceilings
from servelab.studies.s05_attention import plots, recommend, tables, verdicts
from servelab.studies.s05_attention.derived import add_roofline
from servelab.studies.s05_attention.point import TimingPolicy
from servelab.studies.s05_attention.shapes import Architecture
from servelab.studies.s05_attention.sweep import decode_sweep, mask_factories, mask_sweep, prefill_sweep

matplotlib.use("Agg")
FAST = TimingPolicy(target_ms=1, min_repeats=2, max_repeats=2, warmup=1)
ARCHS = [Architecture("a", 2, 1, 8), Architecture("b", 4, 2, 8)]


@pytest.fixture(scope="module")
def run():
    ceil = measure_ceilings(copy_mib=4, matmul_n=128, repeats=3)
    roof = Roofline.from_ceilings(ceil)
    kw = dict(dtype=torch.float32, device="cpu", policy=FAST, progress=False)
    variants = ["naive", "sdpa_default", "sdpa_flash", "sdpa_math", "sdpa_cudnn", "sdpa_repeat_kv"]
    pre = add_roofline(prefill_sweep(ARCHS, [8, 32, 256], variants, **kw), roof)
    # what the H200 produces at the long end: naive out of memory
    long_naive = pre["variant"].eq("naive") & pre["q_len"].eq(256) & pre["arch"].eq("b")
    pre.loc[long_naive, ["status", "median_ms", "peak_mem_bytes", "pct_of_floor"]] = ["oom", np.nan, np.nan, np.nan]
    dec = add_roofline(decode_sweep(ARCHS, [32, 256], [1, 2], variants, max_kv_bytes=10**6, **kw), roof)
    masks = add_roofline(mask_sweep(ARCHS[1], [64, 128], mask_factories(16, 32), ["sdpa_default", "flex"], **kw), roof)
    return ceil, roof, pre, dec, masks


def test_tables_and_findings_from_a_run_with_failures(run):
    ceil, roof, pre, dec, masks = run
    fails = tables.first_failures(pre)
    assert list(fails["variant"]) == ["naive"] and int(fails["first_failure_len"].iloc[0]) == 256
    assert tables.first_failures(dec).empty and "variant" in tables.first_failures(dec).columns
    sp = verdicts.spreads(pre, dec, decode_batch=1, start=256)
    assert set(sp["regime"]) == {"prefill", "decode"}
    # naive failed at 256 on one configuration: the comparison there leaves it out rather than mix shapes
    pre_sp = sp[sp["regime"].eq("prefill")]
    assert set(pre_sp["length"]) == {256} and "naive" not in set(pre_sp["fixed"])
    assert {"sdpa_flash", "sdpa_math"} <= set(pre_sp["fixed"])
    rows, problems = verdicts.findings(pre, ("a", 8), [[8, 256]], dec, length=256)
    assert [r.id for r in rows] == ["F5.1", "F5.2", "F5.3"] and not problems
    assert all(r.verdict in ("holds", "changes", "fails") for r in rows)
    assert all(r.tested_on.startswith("attention alone at a heads") for r in rows[:2])
    assert "b heads" in rows[2].tested_on  # F5.3 compares every configuration
    reco = recommend.recommend(recommend.regimes(pre, dec, masks, long_from=256, small_batch=1))
    assert {"prefill, sliding window mask", "prefill, document mask"} <= set(reco["regime"])
    assert not reco["recommended"].isin(["sdpa_cudnn", "flex"]).any()  # never timed on the CPU
    flex = masks[masks["variant"].eq("flex")]
    assert set(flex["status"]) == {"untimed"} and (flex["rel_error"] < flex["tolerance"]).all()
    gqa = tables.gqa_comparison(dec)
    assert (gqa["repeat_over_gqa"] > 0).all()
    summary = tables.gqa_summary(gqa)
    assert set(summary["phase"]) == {"decode"} and summary["shapes"].sum() == len(gqa)
    assert tables.best_point(dec, "achieved_gb_s")["status"] == "ok"


def test_every_figure_draws(run):
    ceil, roof, pre, dec, masks = run
    figs = [
        plots.prefill_time(pre, roof),
        plots.prefill_tflops(pre, ceil),
        plots.speedup(verdicts.speedup_vs_naive(pre), 2048),
        plots.memory(pre, 8e9),
        plots.memory_growth_bars(verdicts.memory_growth(pre, [[8, 256]])),
        plots.decode_bandwidth(dec, ceil, "b"),
        plots.masks(masks, roof),
        plots.spread(verdicts.spreads(pre, dec, start=256), "prefill"),
        plots.spread(verdicts.spreads(pre, dec, start=256), "decode"),
    ]
    for f in figs:
        assert any(ax.has_data() for ax in f.axes)
        # the quantitative axis carries its unit (category axes are labelled by their ticks)
        assert any("(" in ax.get_xlabel() + ax.get_ylabel() for ax in f.axes)
        matplotlib.pyplot.close(f)
