"""Page text that a reader audit asked for, on Studies 1, 2, 4 and 5: every number computed from the frames given."""

import pandas as pd

from servelab.studies.common.findings import Finding
from servelab.studies.s01_scheduling import fixed_rates, verdicts
from servelab.studies.s02_gpu_costs import eager_spread
from servelab.studies.s02_gpu_costs.report import own_data_f23
from servelab.studies.s04_kv_cache import report as kv_report
from servelab.studies.s05_attention import verdicts as attention_verdicts
from tests.test_scheduling_analysis import sweep


def test_f12_defines_served_with_the_cut_shares_of_the_pair():
    s = sweep(58.6, 34.1, 1000, 1000)
    s["requests"] = 100
    s.loc[s["scheduler"] == "chunked_prefill", "cut"] = 32  # served: at most half cut
    value = verdicts.f12(s, 512).measured_value
    assert "served: at most 50% of the requests cut at the deadline" in value
    assert "ChunkedPrefill cut 32% of its requests, EagerContBatch 0% there" in value
    assert "(ChunkedPrefill cut 32% of its requests, EagerContBatch 0% at the deadline)" in (
        verdicts.f11(s, 512).measured_value
    )


def test_split_label_says_which_part_is_inconclusive_and_who_decides():
    reps = [{"llama": "changes", "qwen": "holds"}, {"llama": "changes", "qwen": "fails"}]
    label = verdicts.split_label(reps)
    assert "qwen part inconclusive over the repeats (holds, fails)" in label
    assert "llama decides: the claim reads changes whichever stands" in label
    assert verdicts.split_label([{"llama": "changes"}, {"llama": "changes"}]) == ""
    both = [{"a": "holds", "b": "holds"}, {"a": "holds", "b": "changes"}]  # b decides between holds and changes
    assert "decides" not in verdicts.split_label(both)


def test_fixed_rates_put_the_slo_against_the_legacy_and_the_runs_probe():
    params = {"capacities": {"config:m": 10.0}, "slo_itl_ms": {"config:m": 50.0}, "rate_fractions": [0.3, 1.2]}
    legacy = pd.DataFrame({"model": ["config:m"], "capacity_req_s": [10.001], "decode_step_s": [0.01]})
    probes = pd.DataFrame({"model": ["config:m"], "decode_step_s": [0.004]})
    text = fixed_rates.fixed_rates_lines(params, probes, legacy)
    assert "capacity 10.00 req/s (the legacy H200 run's probe estimate), so rates 3.00, 12.00 req/s" in text
    assert "5.0× the legacy probe's decode iteration (10.00 ms) and 12.5× the first repeat's (4.00 ms)" in text
    assert "recorded, not used to place the rates or the SLO" in text
    other = legacy.assign(capacity_req_s=7.0)
    assert "fixed by the run's parameters" in fixed_rates.fixed_rates_lines(params, probes, other)
    assert fixed_rates.fixed_rates_lines({"capacities": None}, probes, legacy) == ""


def _eager_steps(times: dict[int, list[float]]) -> pd.DataFrame:
    rows = [
        dict(repeat=k, model="config:m", mode="hf_eager", phase="decode", batch=1, context=c, status="ok", median_ms=ms)
        for c, per_repeat in times.items()
        for k, ms in enumerate(per_repeat)
    ]
    return pd.DataFrame(rows)


def test_eager_spread_sets_repeats_against_contexts():
    said = eager_spread.spread_sentence(_eager_steps({128: [20.0, 30.0], 16384: [22.0, 27.0]}))
    assert "differs by up to 50% over its 2 repeats (m at 128 tokens, 20.0–30.0 ms)" in said
    assert "within one repeat across contexts by up to 11%" in said
    assert "0.90–1.10× the shortest's" in said and "not an effect of context" in said
    rising = eager_spread.spread_sentence(_eager_steps({128: [20.0, 30.0], 16384: [25.0, 36.0]}))
    assert "not an effect of context" not in rising  # a steady rise is not called noise
    assert eager_spread.spread_sentence(_eager_steps({128: [20.0]})) == ""


def test_study_2_labels_only_its_f23_cell():
    def finding(fid):
        return Finding(id=fid, claim="c", seed_value="s", measured_value="7.8", unit="u", verdict="changes", note="n")

    out = own_data_f23([finding("F2.1"), finding("F2.3")])
    assert out[0].measured_value == "7.8"
    assert out[1].measured_value.startswith("7.8 [this study's cost data alone")


def test_cold_start_says_when_the_clock_did_not_drop():
    cold = pd.DataFrame({"state": ["cold", "warm"], "compaction_ms": [6.936, 6.824], "sm_clock_mhz": [1980.0, 1980.0]})
    said = kv_report._cold_start(cold)
    assert "1.02× its back-to-back time" in said and "stayed at 1,980 MHz" in said and "not a clock drop" in said
    dropped = kv_report._cold_start(cold.assign(sm_clock_mhz=[1200.0, 1980.0]))
    assert "(SM clock 1,200 MHz while idle, 1,980 MHz busy)" in dropped and "not a clock drop" not in dropped


def test_compaction_caption_states_the_tables_aggregation():
    comp = pd.DataFrame(
        {
            "status": "ok",
            "method": "block_loop",
            "block_size": 16,
            "pool_mib": [1024, 1024, 4096, 4096],
            "move_fraction": [0.25, 0.5, 0.25, 0.5],
            "gb_s": [1.0, 2.0, 3.0, 4.0],
            "n_repeats": 3,
        }
    )
    caption = kv_report.compaction_caption(comp)
    assert "median over 3 repeats of each point, then the median over the 2 pool sizes and 2 fractions" in caption


def test_f53_names_the_kernels_it_compares():
    spread = pd.DataFrame(
        {
            "regime": "prefill",
            "length": 16384,
            "comparison": ["across kernels, fixed architecture"] * 2 + ["across architectures, fixed kernel"] * 2,
            "fixed": ["a, D=64", "b, D=64", "sdpa_flash", "naive"],
            "spread": [50.0, 60.0, 2.0, 3.0],
        }
    )
    note = attention_verdicts.f53(spread).note
    assert "(2 configurations; the 2 kernels compared: sdpa_flash, naive)" in note


def test_study_2_labels_its_f23_verdict_as_its_own_reading():
    # the page's bold "changes" for F2.3 read as the book's verdict, which is the simulator's (inconclusive)
    from servelab.studies.s02_gpu_costs.report import _finding_sentence, verdict_table

    def finding(fid):
        return Finding(id=fid, claim="c", seed_value="s", measured_value="7.8", unit="u", verdict="changes", note="n",
                       repeats=3)  # fmt: skip

    rows = verdict_table([finding("F2.1"), finding("F2.3")], "H200").splitlines()
    assert rows[2].endswith("| 3 | **changes** | — |")  # F2.1 as it is
    assert rows[3].endswith("| 3 | **changes** (this study's own reading) | — |")
    assert _finding_sentence(finding("F2.3")).startswith("**F2.3 changes (this study's own reading).** C: 7.8")
    assert _finding_sentence(finding("F2.1")).startswith("**F2.1 changes.** C: 7.8")
