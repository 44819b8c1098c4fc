"""Study 1's analysis on hand-made data: the capacity probe's estimate, capacity at an SLO, the F1.x
verdicts (each outcome), and that every figure draws from a sweep-shaped frame."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from servelab.measure.roofline import Roofline
from servelab.models.shape import ModelShape
from servelab.studies.s01_scheduling import plots, report, verdicts
from servelab.studies.s01_scheduling.capacity import capacity_table
from servelab.studies.s01_scheduling.capacity_probe import estimate_capacity, probe_roofline


def steps_frame(rows):
    return pd.DataFrame(rows, columns=["start_s", "end_s", "prefill_tokens", "decode_tokens", "num_seqs"])


def test_capacity_estimate_from_pure_steps():
    steps = steps_frame(
        [(0.0, 0.2, 1000, 0, 2), (0.2, 0.3, 500, 0, 1)]  # 0.3 s for 1500 tokens
        + [(0.3 + i * 0.01, 0.308 + i * 0.01, 0, 3, 3) for i in range(9)]
    )  # 8 ms steps, 10 ms apart
    est = estimate_capacity(
        steps.sample(frac=1, random_state=0), mean_prompt_tokens=300, mean_output_tokens=50, batch=10
    )
    assert est.prefill_s_per_token == pytest.approx(0.3 / 1500)
    assert est.decode_step_s == pytest.approx(0.01)  # start to next start: the server's own time counts
    assert est.request_s == pytest.approx(300 * 0.3 / 1500 + 50 * 0.01 / 10)
    assert est.capacity_req_s == pytest.approx(1 / est.request_s)
    with pytest.raises(ValueError, match="decode-only"):
        estimate_capacity(steps.iloc[:2], mean_prompt_tokens=1, mean_output_tokens=1, batch=1)


def test_capacity_estimate_classifies_steps_like_step_costs():
    """Mixed steps (a prefill chunk beside decodes) and empty steps belong to neither cost: the probe
    classifies steps with ``step_costs.step_kind``, the same rule as the step-cost table."""
    pure = [(0.0, 0.1, 100, 0, 1), (0.1, 0.104, 0, 2, 2), (0.11, 0.114, 0, 2, 2), (0.12, 0.124, 0, 2, 2)]
    est = estimate_capacity(steps_frame(pure), mean_prompt_tokens=100, mean_output_tokens=10, batch=2)
    noisy = pure + [(0.13, 0.5, 50, 2, 3), (0.5, 0.5, 0, 0, 0)]  # one slow mixed step, one empty step
    est2 = estimate_capacity(steps_frame(noisy), mean_prompt_tokens=100, mean_output_tokens=10, batch=2)
    assert est2.prefill_s_per_token == pytest.approx(est.prefill_s_per_token) == pytest.approx(0.1 / 100)
    assert est2.decode_step_s == pytest.approx(0.01)
    assert est2.decode_batch == 2
    with pytest.raises(ValueError, match="prefill-only"):
        estimate_capacity(
            steps_frame([(0.0, 0.1, 50, 2, 3), (0.1, 0.2, 0, 2, 2)]),
            mean_prompt_tokens=1,
            mean_output_tokens=1,
            batch=1,
        )


def test_probe_roofline_sets_costs_against_floors():
    cfg = type(
        "C",
        (),
        dict(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=64,
            intermediate_size=128,
            vocab_size=512,
            head_dim=16,
            model_type="llama",
            tie_word_embeddings=False,
        ),
    )()
    shape = ModelShape.from_config(cfg)
    roof = Roofline(matmul_tflop_s=100.0, copy_gb_s=1000.0)
    steps = steps_frame([(0.0, 0.1, 100, 0, 1), (0.1, 0.101, 0, 2, 2), (0.101, 0.102, 0, 2, 2)])
    est = estimate_capacity(steps, mean_prompt_tokens=100, mean_output_tokens=10, batch=4)
    r = probe_roofline(est, shape, roof, 2)
    floor = float(roof.floor_ms(shape.decode_flops(2, 100), shape.decode_bytes(2, 100, 2)))
    assert r["decode_floor_ms"] == pytest.approx(floor)
    assert r["decode_pct_of_floor"] == pytest.approx(100 * floor / (est.decode_step_s * 1e3))
    assert 0 < r["prefill_pct_of_floor"] < 100


def summary_frame(rows):
    cols = [
        "model",
        "scheduler",
        "budget",
        "rate",
        "rate_fraction",
        "sweep",
        "status",
        "itl_p99_ms",
        "max_itl_ms",
        "mean_ttft_ms",
        "delivered_tok_s",
        "cut",
        "failed",
        "slo_itl_ms",
        "ttft_p50_ms",
    ]
    df = pd.DataFrame(rows, columns=cols[:12])
    df["failed"], df["slo_itl_ms"] = df["cut"], 30.0
    df["ttft_p50_ms"] = df["mean_ttft_ms"]
    # F1.1's stall (the p99 of per-request maxima): a little under the maximum, its interval around it
    df["max_itl_p99_ms"] = df["max_itl_ms"] * 0.98
    df["max_itl_p99_lo_ms"], df["max_itl_p99_hi_ms"] = df["max_itl_p99_ms"] * 0.95, df["max_itl_ms"]
    return df


def sweep(eager_stall, chunked_stall, eager_tp, chunked_tp, eager_ttft=50.0, model="config:m"):
    rows = []
    for f, rate in ((0.5, 1.0), (1.0, 2.0)):
        rows += [
            (model, "eager_cont_batch", 8192, rate, f, "rate", "ok", 20.0, eager_stall, eager_ttft, eager_tp * f, 0),
            (model, "chunked_prefill", 512, rate, f, "rate", "ok", 25.0, chunked_stall, 80.0, chunked_tp * f, 0),
            (model, "fcfs", 8192, rate, f, "rate", "ok", 10.0, 15.0, 400.0, 500.0 * f, 1 if f == 1.0 else 0),
        ]
    return summary_frame(rows)


@pytest.mark.parametrize(
    "eager, chunked, verdict",
    [(58.6, 34.1, "holds"), (300.0, 20.0, "changes"), (50.0, 49.0, "fails"), (50.0, 45.0, "changes")],
)
def test_f11_judges_the_stall_cut(eager, chunked, verdict):
    row = verdicts.f11(sweep(eager, chunked, 1000, 1000), 512)
    assert row.verdict == verdict and row.seed_value.startswith("58.6")
    assert f"{eager * 0.98:.1f} [{eager * 0.98 * 0.95:.1f}–{eager:.1f}] → " in row.measured_value
    assert f"(maximum {eager:.1f} → {chunked:.1f} ms)" in row.measured_value


def test_f11_judges_the_p99_not_the_single_maximum():
    s = sweep(58.6, 34.1, 1000, 1000)  # the maxima: a 42% cut
    chunked = s["scheduler"] == "chunked_prefill"
    s.loc[chunked, "max_itl_p99_ms"] = s.loc[chunked, "max_itl_p99_ms"] * 0.4  # the p99s: a 77% cut
    assert verdicts.f11(s, 512).verdict == "changes"
    old = s.drop(columns=["max_itl_p99_ms", "max_itl_p99_lo_ms", "max_itl_p99_hi_ms"])  # a run before the statistic
    assert verdicts.f11(old, 512).measured_value == "not measured"


def test_f12_gates_on_the_p99_stall_not_the_single_maximum():
    s = sweep(58.6, 34.1, 1000, 1000)  # the maxima: a 42% cut
    chunked = s["scheduler"] == "chunked_prefill"
    s.loc[chunked, "max_itl_p99_ms"] = s.loc[s["scheduler"] == "eager_cont_batch", "max_itl_p99_ms"].to_numpy()
    row = verdicts.f12(s, 512)  # the p99s: no cut at all
    assert row.verdict == "fails" and "stall cut 0%" in row.measured_value
    old = s.drop(columns=["max_itl_p99_ms", "max_itl_p99_lo_ms", "max_itl_p99_hi_ms"])  # a run before the statistic
    assert verdicts.f12(old, 512).measured_value == "not measured"


@pytest.mark.parametrize(
    "chunked_tp, stall, verdict",
    [(1000, 30.0, "holds"), (900, 30.0, "holds"), (1200, 30.0, "changes"), (1000, 58.0, "fails")],
)
def test_f12_weighs_throughput_against_fairness(chunked_tp, stall, verdict):
    assert verdicts.f12(sweep(58.6, stall, 1000, chunked_tp), 512).verdict == verdict


def test_each_claim_headlines_the_number_its_rule_decides_on():
    """F1.1: the median p99 stall cut (%); F1.2: the throughput ratio at the top rate; F1.3: EagerContBatch's
    throughput over the best setting's; over two model sizes, the median of the per-model numbers."""
    one = verdicts.findings(sweep(58.6, 34.1, 1000, 900), 512)
    assert [f.headline for f in one] == pytest.approx([100 * (1 - 34.1 / 58.6), 0.9, 1.0])
    assert (
        one[0].headline_unit == "% cut in the p99 stall, median over rates"
        and "median over" not in one[1].headline_unit
    )
    two = pd.concat([sweep(58.6, 34.1, 1000, 900, model="config:a"), sweep(50.0, 40.0, 1000, 1100, model="config:b")])
    f11, f12, _ = verdicts.findings(two, 512)
    assert f11.headline == pytest.approx(50 * ((1 - 34.1 / 58.6) + 0.2)) and "median over 2 models" in f11.headline_unit
    assert f12.headline == pytest.approx(1.0)  # 0.9 and 1.1
    assert verdicts.findings(summary_frame([]), 512)[0].headline is None  # nothing measured: no headline


def test_f13_and_combination_across_models():
    both = verdicts.f13(sweep(58.6, 34.1, 1000, 900))  # eager: lowest TTFT, highest throughput
    assert both.verdict == "holds"
    slower = verdicts.f13(sweep(58.6, 34.1, 1000, 1200))  # ChunkedPrefill delivers more
    assert slower.verdict == "changes"
    neither = verdicts.f13(sweep(58.6, 34.1, 1000, 1200, eager_ttft=500.0))
    assert neither.verdict == "fails"
    mixed = pd.concat(
        [sweep(58.6, 34.1, 1000, 1000, model="config:a"), sweep(50.0, 49.9, 1000, 1000, model="config:b")]
    )
    row = verdicts.f11(mixed, 512)
    assert row.verdict == "changes" and "a: holds" in row.note and "b: fails" in row.note


def test_runs_past_capacity_are_left_out_of_the_pairs():
    s = sweep(58.6, 34.1, 1000, 1000)
    s["requests"] = 10
    late = (s["scheduler"] == "chunked_prefill") & (s["rate_fraction"] == 1.0)
    s.loc[late, "cut"] = 8  # most requests cut: past capacity
    assert verdicts.paired(s, 512)["rate_fraction"].tolist() == [0.5]
    s.loc[late, "cut"], s.loc[late, "max_itl_ms"] = 0, float("nan")  # no stall measured at all
    assert verdicts.paired(s, 512)["rate_fraction"].tolist() == [0.5]
    s.loc[s["scheduler"] == "chunked_prefill", "max_itl_ms"] = float("nan")
    assert verdicts.f12(s, 512).measured_value == "not measured"  # never judged on NaN


def test_missing_data_is_said_not_invented():
    empty = summary_frame([])
    rows = verdicts.findings(empty, 512)
    assert [r.measured_value for r in rows] == ["not measured"] * 3
    assert all("could not be judged" in r.note for r in rows)


def test_capacity_is_the_highest_rate_below_the_first_miss():
    rows = [
        ("config:m", "chunked_prefill", 512, r, r, "rate", "ok", itl, 0, 0, 0, cut)
        for r, itl, cut in ((1.0, 10.0, 0), (2.0, 25.0, 0), (4.0, 40.0, 0), (8.0, 20.0, 3))
    ]
    rows += [("config:m", "fcfs", 8192, r, r, "rate", "ok", 50.0, 0, 0, 0, 0) for r in (1.0, 2.0)]
    rows += [("config:m", "eager_cont_batch", 8192, r, r, "rate", "ok", 5.0, 0, 0, 0, 0) for r in (1.0, 2.0)]
    rows += [("config:m", "chunked_prefill", 128, 2.0, 2.0, "budget", "ok", 5.0, 0, 0, 0, 0)]  # not a rate sweep
    cap = capacity_table(summary_frame(rows)).set_index(["scheduler", "budget"])
    assert cap.loc[("chunked_prefill", 512), "capacity_req_s"] == 2.0  # 4.0 misses; 8.0 meets ITL but was cut
    assert cap.loc[("chunked_prefill", 512), "bound"] == "within sweep"
    assert np.isnan(cap.loc[("fcfs", 8192), "capacity_req_s"])  # missed at every rate: not a measured zero
    assert cap.loc[("fcfs", 8192), "bound"] == "below lowest rate"
    assert cap.loc[("fcfs", 8192), "first_miss_rate"] == 1.0 and cap.loc[("fcfs", 8192), "lowest_rate"] == 1.0
    assert cap.loc[("eager_cont_batch", 8192), "bound"] == "at least highest rate"
    assert len(cap) == 3


def test_figures_draw_from_sweep_shaped_frames():
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    req, steps = [], []
    for sched, budget in (("eager_cont_batch", 8192), ("chunked_prefill", 512)):
        for f, rate in ((0.5, 1.0), (1.0, 2.0)):
            for i in range(4):
                times = np.cumsum(rng.uniform(0.005, 0.05, 6)) + i * 0.1
                req.append(
                    {
                        "model": "config:m",
                        "scheduler": sched,
                        "budget": budget,
                        "rate": rate,
                        "rate_fraction": f,
                        "sweep": "rate",
                        "request_id": i,
                        "arrival_s": i * 0.1,
                        "prompt_tokens": 10,
                        "output_tokens": 6,
                        "sent_s": i * 0.1,
                        "first_token_s": times[0],
                        "finish_s": times[-1],
                        "token_times_s": list(times),
                        "ok": True,
                        "error": "",
                    }
                )
            t = np.cumsum(rng.uniform(0.005, 0.02, 30))
            steps.append(
                pd.DataFrame(
                    {
                        "model": "config:m",
                        "scheduler": sched,
                        "budget": budget,
                        "rate": rate,
                        "rate_fraction": f,
                        "sweep": "rate",
                        "start_s": t,
                        "end_s": t + 0.004,
                        "prefill_tokens": rng.integers(0, 500, 30),
                        "decode_tokens": 4,
                        "num_seqs": 4,
                        "num_waiting": 0,
                        "num_preempted": 0,
                        "decode_steps": 1,
                    }
                )
            )
    rm = report.per_request(pd.DataFrame(req))
    st = pd.concat(steps)
    s = sweep(58.6, 34.1, 1000, 1000)
    cap = capacity_table(s)
    figs = [
        plots.latency_cdfs(rm, "config:m", 1.0, "dev"),
        plots.stall_distribution(rm, "dev"),
        plots.throughput_latency(s, "dev"),
        plots.capacity_bars(cap, "dev"),
        plots.timeline(st, "config:m", 1.0, "dev"),
        plots.budget_sweep(s, "config:m", 1.0, "dev"),
    ]
    assert all(f.axes for f in figs)
    assert figs[4].axes[0].get_xlabel() == "" and "tokens" in figs[4].axes[0].get_ylabel()
    # a rate no part has measured yet (a study measured part by part): a figure that says so, not a crash
    for fig in (plots.latency_cdfs(rm, "config:m", 0.7, "dev"), plots.timeline(st, "config:m", 0.7, "dev")):
        assert any("measured yet" in t.get_text() for ax in fig.axes for t in ax.texts)
    plt.close("all")


def test_findings_name_what_they_were_tested_on():
    s = pd.concat(
        [sweep(58.6, 34.1, 1000, 1000, model="config:qwen2-0.5b"), sweep(58.6, 34.1, 1000, 1000, model="org/ckpt")]
    )
    f11, _, f13 = verdicts.findings(s, 512, dtype="bfloat16")
    assert f11.tested_on == (
        "qwen2-0.5b (architecture-exact, random weights; bfloat16); org/ckpt (trained weights; bfloat16); "
        "4 paired runs (model × rate) served over HTTP"
    )
    assert f13.tested_on.endswith("3 policy settings × 2 rates")
    assert all(f.tested_on == "" for f in verdicts.findings(summary_frame([]), 512))  # nothing ran: nothing named


def _two_cuts(cut_half_rate: float, cut_full_rate: float) -> pd.DataFrame:
    """A sweep whose stall cut (the p99 stall F1.1 and F1.2 read, and the single maximum) is ``cut_half_rate`` at rate
    fraction 0.5 and ``cut_full_rate`` at 1.0."""
    s = sweep(100.0, 50.0, 1000, 1000)
    s["max_itl_p99_ms"] = s["max_itl_ms"]
    chunked = s["scheduler"] == "chunked_prefill"
    for f, cut in ((0.5, cut_half_rate), (1.0, cut_full_rate)):
        s.loc[chunked & (s["rate_fraction"] == f), ["max_itl_ms", "max_itl_p99_ms"]] = 100.0 * (1 - cut)
    return s


def test_a_cut_within_its_noise_of_a_threshold_is_said_so():
    # the committed qwen2-0.5b case: cuts 56.4% and 83.6%, median 70.01% against the 20-70% band
    near = verdicts.f11(_two_cuts(0.5641, 0.8361), 512)
    assert near.verdict == "changes"
    assert "Near a threshold: m's median cut 70.01% is within one noise width (±13.6 points" in near.note
    assert "of the 70% threshold" in near.note and "56.4%–83.6%" in near.note
    far = verdicts.f11(_two_cuts(0.40, 0.44), 512)  # 42% ± 2 points: far from 20% and 70%
    assert far.verdict == "holds" and "Near a threshold" not in far.note
    gate = verdicts.f12(_two_cuts(0.0, 0.12), 512)  # a 6% cut ± 6 points: the 5% stall-cut gate is within reach
    assert gate.verdict == "holds" and "of the 5% threshold" in gate.note
    assert np.isnan(verdicts.cut_noise(pd.Series([0.7])))  # one rate: no noise estimate
    one_rate = _two_cuts(0.70, 0.70)
    one_rate = one_rate[one_rate["rate_fraction"] == 0.5]
    assert "Near a threshold" not in verdicts.f11(one_rate, 512).note


def test_f13_names_the_best_setting_by_the_seeds_name_and_says_a_tie():
    # the note read "vs best 953 (chunked_prefill@2048)" and "6,638 tok/s vs best 6,638 (eager_cont_batch)"
    slower = verdicts.f13(sweep(58.6, 34.1, 1000, 1200))
    said = slower.measured_value
    assert "throughput 1,000 tok/s vs best 1,200 (ChunkedPrefill@512)" in said
    assert "chunked_prefill" not in said and "eager_cont_batch" not in said
    best = verdicts.f13(sweep(58.6, 34.1, 1000, 900)).measured_value
    assert "throughput 1,000 tok/s, the highest" in best and "vs best" not in best
    tied = verdicts.f13(sweep(58.6, 34.1, 1000, 1000)).measured_value
    assert "throughput 1,000 tok/s, the highest, tied with ChunkedPrefill@512" in tied
