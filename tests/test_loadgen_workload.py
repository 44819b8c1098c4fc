"""Arrivals, length distributions and traces: statistics with fixed seeds, JSONL round trips, bad input."""

import json

import numpy as np
import pytest

from servelab.errors import ParameterError
from servelab.loadgen.arrivals import gamma_arrivals, poisson_arrivals
from servelab.loadgen.lengths import FixedLengths, ShareGPTLike, UniformLengths, length_distribution
from servelab.loadgen.workload import Trace


def test_poisson_rate_and_exponential_gaps():
    t = poisson_arrivals(20.0, 20_000, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0], t]))
    assert np.all(gaps > 0)
    assert 1 / gaps.mean() == pytest.approx(20.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_rate_and_sets_cv(burstiness):
    gaps = np.diff(np.concatenate([[0], gamma_arrivals(10.0, 20_000, np.random.default_rng(1), burstiness)]))
    assert 1 / gaps.mean() == pytest.approx(10.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.07)  # gamma: CV 1/sqrt(k)


def test_infinite_rate_is_a_burst_and_bad_rates_fail():
    assert np.all(gamma_arrivals(float("inf"), 5, np.random.default_rng(0)) == 0)
    for bad in (0, -1, "3", True):
        with pytest.raises(ParameterError, match="rate"):
            poisson_arrivals(bad, 3, np.random.default_rng(0))
    with pytest.raises(ParameterError, match="burstiness"):
        gamma_arrivals(1.0, 3, np.random.default_rng(0), burstiness=0)


def test_lengths():
    rng = np.random.default_rng(0)
    p, o = FixedLengths(100, 7).sample(4, rng)
    assert p.tolist() == [100] * 4 and o.tolist() == [7] * 4
    p, o = UniformLengths(5, 9, 1, 2).sample(2000, rng)
    assert p.min() == 5 and p.max() == 9 and set(o.tolist()) == {1, 2}
    d = ShareGPTLike()
    p, o = d.sample(50_000, rng)
    # the lognormal goes through the published median and p90 (clipping at 8,000 is above the p90)
    assert np.median(p) == pytest.approx(1730, rel=0.03) and np.percentile(p, 90) == pytest.approx(5696, rel=0.04)
    assert np.median(o) == pytest.approx(415, rel=0.03) and np.percentile(o, 90) == pytest.approx(834, rel=0.04)
    assert p.max() <= 8000 and p.min() >= 1
    small_p, small_o = ShareGPTLike(prompt_scale=0.1, output_scale=0.5, prompt_max=400).sample(5000, rng)
    assert np.median(small_p) == pytest.approx(173, rel=0.05) and small_p.max() <= 400
    assert np.median(small_o) == pytest.approx(207.5, rel=0.05)
    assert "Sarathi-Serve" in d.source
    assert FixedLengths(100, 7).means() == (100, 7) and UniformLengths(5, 9, 1, 2).means() == (7, 1.5)
    assert d.means()[0] == pytest.approx(p.mean(), rel=0.02)


def test_bad_lengths():
    with pytest.raises(ParameterError):
        FixedLengths(0, 5)
    with pytest.raises(ParameterError, match="min <= max"):
        UniformLengths(10, 5, 1, 1)
    with pytest.raises(ParameterError, match="90th percentile"):
        ShareGPTLike(prompt_median=100, prompt_p90=50)
    with pytest.raises(ParameterError, match="unknown length"):
        length_distribution("zipf")
    with pytest.raises(ParameterError, match="bad parameters"):
        length_distribution("fixed", prompt=3)


def test_synthetic_trace_is_deterministic_and_bounded():
    a = Trace.synthetic(rate=5, lengths=FixedLengths(16, 4), duration_s=10, seed=3)
    b = Trace.synthetic(rate=5, lengths=FixedLengths(16, 4), duration_s=10, seed=3)
    assert a.frame.equals(b.frame)
    assert a.duration_s <= 10 and 25 <= len(a) <= 80
    assert a.frame["arrival_s"].is_monotonic_increasing
    assert len(Trace.synthetic(rate=5, lengths=FixedLengths(16, 4), n=7)) == 7
    bursty = Trace.synthetic(rate=50, lengths=FixedLengths(16, 4), duration_s=20, burstiness=0.05, seed=0)
    assert bursty.duration_s > 15  # very bursty arrivals still fill the window
    with pytest.raises(ParameterError, match="exactly one"):
        Trace.synthetic(rate=5, lengths=FixedLengths(16, 4))


def test_prompt_ids_are_random_in_range_and_reproducible():
    t = Trace.synthetic(rate=5, lengths=UniformLengths(8, 64, 1, 4), n=20, seed=1).with_prompt_ids(100, seed=2)
    ids = t.frame["prompt_ids"]
    assert all(len(x) == n for x, n in zip(ids, t.frame["prompt_tokens"], strict=True))
    assert all(0 <= v < 100 for x in ids for v in x)
    assert all(len(set(x)) > 1 for x in ids)  # never a constant prompt
    again = Trace.synthetic(rate=5, lengths=UniformLengths(8, 64, 1, 4), n=20, seed=1).with_prompt_ids(100, seed=2)
    assert again.frame["prompt_ids"].tolist() == ids.tolist()


def test_jsonl_round_trip_and_replay_by_hand(tmp_path):
    t = Trace.synthetic(rate=5, lengths=FixedLengths(6, 3), n=5, seed=0).with_prompt_ids(50)
    back = Trace.read_jsonl(t.write_jsonl(tmp_path / "t.jsonl"))
    assert back.frame[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]].equals(
        t.frame[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]]
    )
    assert back.frame["prompt_ids"].tolist() == t.frame["prompt_ids"].tolist()
    hand = tmp_path / "hand.jsonl"
    hand.write_text(
        json.dumps({"arrival_s": 1.5, "prompt_ids": [1, 2, 3], "output_tokens": 2})
        + "\n\n"
        + json.dumps({"arrival_s": 0.5, "prompt_ids": [4, 5, 6, 7], "output_tokens": 1})
        + "\n"
    )
    h = Trace.read_jsonl(hand)
    assert h.frame["arrival_s"].tolist() == [0.5, 1.5]  # sorted by arrival
    assert h.frame["prompt_tokens"].tolist() == [4, 3]  # from the ids
    hand.write_text(
        json.dumps({"arrival_s": 1.5, "prompt_ids": [1, 2, 3], "output_tokens": 2})
        + "\n"
        + json.dumps({"arrival_s": 0.5, "prompt_tokens": 4, "output_tokens": 1})
        + "\n"
    )
    with pytest.raises(ParameterError, match="every request"):
        Trace.read_jsonl(hand)


def test_bad_traces_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}\n{oops\n')
    with pytest.raises(ParameterError, match="bad.jsonl:2"):
        Trace.read_jsonl(bad)
    bad.write_text('{"arrival_s": 0, "output_tokens": 1, "prompt": "hi"}\n')
    with pytest.raises(ParameterError, match="prompt_tokens"):
        Trace.read_jsonl(bad)
    with pytest.raises(ParameterError, match="does not exist"):
        Trace.read_jsonl(tmp_path / "nope.jsonl")
    import pandas as pd

    with pytest.raises(ParameterError, match="arrival_s"):
        Trace(pd.DataFrame({"arrival_s": [-1.0], "prompt_tokens": [3], "output_tokens": [1]}))
    with pytest.raises(ParameterError, match="output_tokens"):
        Trace(pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [3], "output_tokens": [0]}))
    with pytest.raises(ParameterError, match="prompt_ids"):
        Trace(pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [3], "output_tokens": [1], "prompt_ids": [[1]]}))


def _ids_trace(prompts, outputs):
    return Trace.synthetic(rate=10, lengths=FixedLengths(1, 1), n=len(prompts), seed=0).frame.assign(
        prompt_tokens=prompts, output_tokens=outputs, prompt_ids=[list(range(3, 3 + p)) for p in prompts]
    )


def test_fit_context_cuts_prompts_and_keeps_outputs():
    t = Trace(_ids_trace([100, 90, 30, 5], [10, 10, 10, 300]))
    fitted, clipped, dropped = t.fit_context(100)
    f = fitted.frame
    assert (clipped, dropped) == (2, 0) and len(f) == 4  # 90 + 10 fits exactly
    assert f["prompt_tokens"].tolist() == [90, 90, 30, 1]  # the output kept; one left too long alone is cut
    assert f["output_tokens"].tolist() == [10, 10, 10, 99]
    assert f["prompt_ids"].iloc[0] == list(range(3, 93))  # the first tokens kept
    assert ((f["prompt_tokens"] + f["output_tokens"]) <= 100).all()
    assert [len(x) for x in f["prompt_ids"]] == f["prompt_tokens"].tolist()
    assert t.fit_context(400) == (t, 0, 0)
    assert "fitted to a 100-token context (2 clipped, 0 dropped)" in fitted.source
    with pytest.raises(ParameterError, match="max_model_len"):
        t.fit_context(1)


def test_fit_context_cuts_a_text_prompts_output_or_drops_it():
    df = Trace.synthetic(rate=10, lengths=FixedLengths(1, 1), n=3, seed=0).frame
    t = Trace(df.assign(prompt_tokens=[50, 95, 120], output_tokens=[20, 20, 20], prompt=["a", "b", "c"]))
    fitted, clipped, dropped = t.fit_context(100)
    assert (clipped, dropped) == (1, 1)
    assert fitted.frame["prompt"].tolist() == ["a", "b"]
    assert fitted.frame["output_tokens"].tolist() == [20, 5] and fitted.frame["prompt_tokens"].tolist() == [50, 95]
