"""Study 4's reporting path from files only: nothing measured, three synthetic repeats, a changed number, a missing
CSV, the legacy run, and the measuring path's fingerprint free of reporting code."""

import json

import matplotlib
import numpy as np
import pandas as pd

from servelab.measure.fingerprint import fingerprint
from servelab.paths import DATA_DIR
from servelab.studies.common.runs import RunSet, study_runs
from servelab.studies.s04_kv_cache import plots, report

matplotlib.use("Agg")

STUDY = "04_kv_cache"
LEGACY = DATA_DIR / "results/nvidia-h200/04_kv_cache/runs/legacy/all/r0"
DEVICE = {"name": "Test H200", "slug": "nvidia-h200", "kind": "cuda"}
PARAMS = {
    "decode_model": "config:gpt2",
    "decode_dtype": "float16",
    "capacity_model": "config:llama-3-8b",
    "capacity_dtype": "bfloat16",
    "capacity_budget_gib": 1,
    "capacity_max_len": 1024,
}


def bpt(pool_bytes: float = 36864.0) -> pd.DataFrame:
    exact = pool_bytes == 36864.0
    return pd.DataFrame(
        [
            dict(
                model="config:gpt2",
                dtype="float16",
                attention="MHA",
                layers=12,
                heads=12,
                kv_heads=12,
                head_dim=64,
                dtype_bytes=2,
                formula_bytes=36864,
                hf_bytes_per_token=36864.0,
                pool_bytes_per_token=pool_bytes,
                exact=exact,
                status="ok",
            )
        ]  # fmt: skip
    )


def decode_steps(slope_ms_per_token: float = 0.0) -> pd.DataFrame:
    """Decode at batch 1 and 16 over four contexts: flat (slope 0) and at 60% of the floor, or growing."""
    rows = []
    for mode in ("hf_eager", "hf_cuda_graph"):
        for b in (1, 16):
            for c in (64, 128, 256, 512):
                ms = 1.0 + slope_ms_per_token * b * c
                kv = b * c * 36864
                rows.append(dict(model="config:gpt2", mode=mode, batch=b, context=c, status="ok", median_ms=ms,
                                 p25_ms=ms, p75_ms=ms, floor_ms=0.6, pct_of_floor=60.0, kv_bytes=kv,
                                 bytes=kv + 2.5e8, achieved_gb_s=(kv + 2.5e8) / ms / 1e6))  # fmt: skip
    return pd.DataFrame(rows)


def compaction(gb_s: float = 40.0) -> pd.DataFrame:
    return pd.DataFrame(
        [dict(pool_mib=1024, block_size=bs, move_fraction=0.5, method=m, status="ok", blocks_moved=100, gb_s=gb_s,
              median_ms=1.0, us_per_block=10.0) for bs in (16, 64) for m in ("gather_scatter", "block_loop")]
    )  # fmt: skip


def overlap_runs(speedup: float = 1.3, seed: int = 0) -> pd.DataFrame:
    """Rounds of every condition at one decode batch: the compaction ``speedup``× faster during decode."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(20):
        noise = lambda: 1 + 0.01 * rng.standard_normal()  # noqa: E731
        for cond, c, d in (("compaction_alone", 6.5, np.nan), ("decode_alone", np.nan, 6.0),
                           ("serialised", 6.5, 6.0), ("concurrent", 6.5 / speedup, 6.2),
                           ("concurrent_prioritised", 6.5 / speedup, 6.1)):  # fmt: skip
            c, d = c * noise(), d * noise()
            rows.append(dict(round=r, order=0, condition=cond, compaction_ms=c, decode_ms=d,
                             total_ms=np.nansum([c, d]), decode_batch=1))  # fmt: skip
    return pd.DataFrame(rows)


def capacity() -> pd.DataFrame:
    rows = []
    for phase in ("complete", "mid_decode"):
        for trial in range(2):
            rows.append(dict(phase=phase, trial=trial, layout="contiguous", block_size=1024, sequences=8,
                             fragmentation_pct=60.0, budget_used_pct=40.0, bytes_per_token=131072,
                             length_source="assumed"))  # fmt: skip
            for bs, frag in ((16, 1.0 + trial), (64, 4.0)):
                rows.append(dict(phase=phase, trial=trial, layout="paged", block_size=bs, sequences=20,
                                 fragmentation_pct=frag, budget_used_pct=100 - frag, bytes_per_token=131072,
                                 length_source="assumed"))  # fmt: skip
    return pd.DataFrame(rows)


def tables(**kw) -> dict[str, pd.DataFrame]:
    t = dict(bytes_per_token=bpt(), decode_steps=decode_steps(), compaction=compaction(), capacity=capacity(),
             overlap_runs=overlap_runs(), overlap_rig=pd.DataFrame([dict(decode_batch=1, decode_mode="hf_cuda_graph",
                                                                           decode_steps=1)]))  # fmt: skip
    t.update(kw)
    return t


def write_runs(root, per_repeat: list[dict], fp="e" * 64) -> RunSet:
    for k, tabs in enumerate(per_repeat):
        d = root / "nvidia-h200" / STUDY / "runs" / fp[:12] / "all" / f"r{k}"
        d.mkdir(parents=True)
        for name, df in tabs.items():
            df.to_csv(d / f"{name}.csv", index=False)
        meta = dict(study=STUDY, fingerprint=fp, part="all", repeat_index=k, seed=k, complete=True, device=DEVICE,
                    ceilings={"copy_gb_s": 4000.0}, params=PARAMS, written_utc="2026-01-01T00:00:00+00:00")  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta))
    return study_runs(STUDY, root)


def verdicts(page) -> dict[str, str]:
    return {f.id: f.verdict for f in page.findings}


def test_nothing_measured_gives_inconclusive_findings_and_empty_tables(tmp_path):
    for runs in (study_runs(STUDY, tmp_path), RunSet(STUDY)):
        page = report.report(runs)
        assert verdicts(page) == dict.fromkeys(["F4.1", "F4.2", "F4.3", "F4.4"], "inconclusive")
        assert page.bpt.empty and page.capacity.empty and page.overlap_runs.empty
        assert report.published_value(runs) is None
        assert "not measured" in report.takeaways(page)
        assert report.published(page)


def test_three_synthetic_repeats_give_the_rules_verdicts(tmp_path):
    page = report.report(write_runs(tmp_path, [tables(overlap_runs=overlap_runs(seed=k)) for k in range(3)]))
    assert verdicts(page) == {"F4.1": "holds", "F4.2": "holds", "F4.3": "holds", "F4.4": "holds"}
    assert all(f.repeats == 3 for f in page.findings)
    # the running server's snapshot (requests caught mid-decode), the like-for-like of a serving system's waste
    assert report.published_value(page.runs) == (
        "1.5 %",
        "paged pool, 16-token blocks, requests caught mid-decode, median over trials",
    )
    assert "paged 16-token blocks hold 20 sequences" in report.takeaways(page)
    figs = [
        plots.bytes_per_token(page.bpt, page.device),
        plots.capacity(page.capacity, PARAMS["capacity_model"], 1),
        plots.decode_scaling(page.decode_steps, page.device),
        plots.compaction_bandwidth(page.compaction, page.copy_gb_s, page.device),
        plots.overlap(page.overlap_runs, 1, page.device),
    ]
    for fig in figs:
        assert fig.get_size_inches()[0] <= 8.0
    seeds = [[t.get_text() for t in fig.legends[0].get_texts()] for fig in figs if fig.legends]
    assert sum(any(lab.startswith("RTX 2070 (seed)") for lab in labels) for labels in seeds) == 4  # not capacity
    for fig in figs:
        matplotlib.pyplot.close(fig)


def test_changing_a_number_in_a_raw_csv_changes_the_verdict(tmp_path):
    page = report.report(write_runs(tmp_path / "a", [tables(compaction=compaction(1500.0))] * 3))
    assert verdicts(page)["F4.3"] == "changes"  # 1,500 GB/s is far above the seed's 19–67
    page = report.report(write_runs(tmp_path / "b", [tables(bytes_per_token=bpt(40000.0))] * 3))
    assert verdicts(page)["F4.1"] == "changes"
    page = report.report(write_runs(tmp_path / "c", [tables(overlap_runs=overlap_runs(1.0))] * 3))
    assert verdicts(page)["F4.4"] == "fails"  # no faster during decode
    # one repeat disagreeing leaves the claim inconclusive
    page = report.report(write_runs(tmp_path / "d", [tables(), tables(), tables(compaction=compaction(1500.0))]))
    assert verdicts(page)["F4.3"] == "inconclusive"


def test_fewer_than_three_repeats_is_inconclusive(tmp_path):
    page = report.report(write_runs(tmp_path, [tables()]))
    assert set(verdicts(page).values()) == {"inconclusive"}


def test_a_missing_csv_leaves_its_claim_not_measured(tmp_path):
    runs = write_runs(tmp_path, [tables() for _ in range(3)])
    for r in runs.runs:
        (r.dir / "compaction.csv").unlink()
        (r.dir / "overlap_runs.csv").unlink()
    page = report.report(runs)
    v = verdicts(page)
    assert v["F4.3"] == v["F4.4"] == "inconclusive" and v["F4.1"] == "holds"
    assert page.compaction.empty and page.overlap_summary.empty
    assert report.compaction_sentences(page) == ""
    assert "no CUDA device" in report.overlap_sentences(page)  # no probe table either: it says why nothing shows


def test_the_legacy_run_is_read_and_judged_by_todays_rules():
    """The first H200 run, read alone as a stale page reads it. (The test took the newest committed runs and skipped
    unless they were the legacy ones: once a newer run was committed it skipped everywhere.)"""
    runs = study_runs(STUDY, DATA_DIR / "results").at("legacy")
    assert runs.fingerprint == "legacy" and runs.measured
    page = report.report(runs)
    assert not page.overlap_summary.empty and "compaction_speedup" in page.overlap_summary  # rig from old summary
    assert {f.id for f in page.findings} == {"F4.1", "F4.2", "F4.3", "F4.4"}
    assert all(f.repeat_verdicts for f in page.findings)
    old = pd.read_csv(LEGACY / "findings.csv")
    assert [v.split(";")[0] for v in (f.repeat_verdicts for f in page.findings)] == old["verdict"].tolist()


def test_measuring_fingerprint_has_no_reporting_module():
    files = fingerprint(f"servelab.studies.s{STUDY}.measure").files
    assert any(p.endswith("s04_kv_cache/measure.py") for p in files)
    banned = ("report.py", "plots.py", "verdicts.py", "derived.py", "common/page.py", "common/runs.py",
              "common/study.py", "common/campaign.py", "common/published.py", "common/markdown.py")  # fmt: skip
    assert not [p for p in files if p.endswith(banned) or "servelab_book/" in p]


def test_one_sm_clock_reads_throughout():
    kernels = pd.DataFrame({"alone_us": [1.0], "during_decode_ratio": [1.0]})
    same = report._kernels_and_clocks(kernels, pd.DataFrame({"clocks.sm": [1980, 1980]}))
    assert "1,980 MHz throughout" in same and "1,980–1,980" not in same
    assert "1,900–1,980 MHz" in report._kernels_and_clocks(kernels, pd.DataFrame({"clocks.sm": [1900, 1980]}))


def test_compact_tables_use_the_pages_words_and_separators():
    # 2026-12 audit: the compaction table read "gather_scatter_wide | 1776 | 1784" beside prose writing 1,776, and
    # the modes, conditions and snapshots their run identifiers
    comp = pd.DataFrame([dict(status="ok", method=m, block_size=16, gb_s=gb, pool_mib=1024, move_fraction=0.5)
                         for m, gb in (("block_loop", 44.0), ("gather_scatter_wide", 1776.4))])  # fmt: skip
    v = report.compaction_view(comp).set_index("mover")
    assert v.loc["wide gather/scatter", "16-token blocks (GB/s)"] == "1,776"
    assert v.loc["naive per-block loop", "16-token blocks (GB/s)"] == "44"
    var = pd.DataFrame([dict(mode="hf_cuda_graph", batch=16, trend_pct=21.7, variation_pct=21.0,
                             marginal_kv_gb_s=2841.6, pct_of_floor_at_max_context=18.0)])  # fmt: skip
    v = report.variation_view(var)
    assert v["mode"].tolist() == ["HF CUDA graph"] and v["marginal KV read (GB/s)"].tolist() == ["2,841.6"]
    row = dict(phase="mid_decode", layout="contiguous", block_size=8192, sequences=1604.0, fragmentation_pct=93.8,
               budget_used_pct=6.2)  # fmt: skip
    cap = report.capacity_view(pd.DataFrame([row]))
    assert cap.iloc[0].tolist() == ["mid-decode", "contiguous", "8,192", "1,604", 93.8, 6.2]
    runs = pd.DataFrame([dict(decode_batch=1, condition=c, compaction_ms=1.0, decode_ms=1.0, total_ms=2.0)
                         for c in ("concurrent_prioritised", "compaction_alone")])  # fmt: skip
    assert set(report.overlap_view(runs)["condition"]) == {"concurrent, decode prioritised", "compaction alone"}
