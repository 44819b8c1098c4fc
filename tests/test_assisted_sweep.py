"""Study 6's sweep plan and budget (a fake runner on a fake clock: deterministic), the study deadline, the
SDPA backend switch and its first-call probe, and the coverage tables."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from servelab.studies.common.budget import Budget
from servelab.studies.s06_hf_assisted import analysis
from servelab.studies.s06_hf_assisted.attention_backend import first_call_costs, first_call_summary, hf_sdpa
from servelab.studies.s06_hf_assisted.runs import GenerationRun, Job, Pair, times_at_lengths
from servelab.studies.s06_hf_assisted.sweep import CostEstimates, Pass, plan_passes, run_order, run_passes

PAIRS = [Pair("a", "T"), Pair("b", "T"), Pair("a", "b")]


class FakeRunner:
    """Each job costs ``s_per_token[method, draft]`` seconds of a fake clock per token; ``max_time`` stops a
    run early, as HF's does. Plain runs cost 1 s/token unless given."""

    def __init__(self, s_per_token: dict, fail: set = frozenset()):
        self.now = 0.0
        self.s_per_token = s_per_token
        self.fail = fail
        self.calls: list[tuple] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, job: Job, prompt, n: int, max_time=None) -> GenerationRun:
        self.calls.append((job.key, n))
        if job.key in self.fail:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
        cost = self.s_per_token.get((job.method, job.draft), 1.0)
        made = n if max_time is None or max_time >= n * cost else int(max_time // cost)
        self.now += (made if made < n else n) * cost
        counts = np.arange(1, made + 1)
        return GenerationRun([7] * made, counts, counts * cost * 1e3)


def passes_for(n_prompts=3, long=16, short=4, cost=2, own=False):
    return plan_passes(
        PAIRS,
        n_prompts,
        max_new_tokens=long,
        short_new_tokens=short,
        cost_tokens=cost,
        prompt_lookup_targets=["T"],
        own=own,
    )


def test_plan_is_short_long_then_spread_and_the_long_pass_has_no_cost_runs():
    ps = passes_for(own=True)
    assert [(p.prompt, p.kind, p.new_tokens) for p in ps] == [(0, "short", 4), (1, "long", 16), (2, "spread", 4)]
    assert Job("plain", "a", None, 2) in ps[0].jobs and Job("plain", "b", None, 4) in ps[0].jobs  # b is a target
    assert not any(j.method == "plain" and j.target == "a" for j in ps[1].jobs)
    assert {j.new_tokens for j in ps[1].jobs} == {16} and ps[2].jobs == ps[0].jobs
    assert {j.method for j in ps[1].jobs} == {"plain", "assisted", "prompt_lookup", "own_plain", "own"}
    one = plan_passes(
        PAIRS, 1, max_new_tokens=16, short_new_tokens=4, cost_tokens=2, prompt_lookup_targets=[], own=False
    )
    assert [(p.kind, p.new_tokens) for p in one] == [("long", 16)]  # one prompt: it runs the longest output
    assert Job("plain", "a", None, 2) in one[0].jobs
    with pytest.raises(ValueError):
        plan_passes(PAIRS, 0, max_new_tokens=16, short_new_tokens=4, cost_tokens=2, prompt_lookup_targets=[], own=False)


def test_long_pass_runs_target_by_target_baseline_first_then_cheapest_first():
    long = passes_for(own=True)[1]
    est = CostEstimates()
    for job, s in [
        (Job("assisted", "T", "a", 4), 3.0),
        (Job("assisted", "T", "b", 4), 0.5),
        (Job("prompt_lookup", "T", None, 4), 1.0),
        (Job("own", "T", "a", 4), 0.01),
        (Job("own", "T", "b", 4), 0.02),
        (Job("own_plain", "T", None, 4), 0.01),
    ]:
        est.record(job, GenerationRun([1] * 4, np.arange(1, 5), np.arange(1, 5) * s * 1e3))
    order = [(j.method, j.target, j.draft) for j in run_order(long, est)]
    assert order == [
        ("plain", "T", None),  # the main target's baseline
        ("own_plain", "T", None),
        ("own", "T", "a"),
        ("own", "T", "b"),
        ("assisted", "T", "b"),
        ("prompt_lookup", "T", None),
        ("assisted", "T", "a"),
        ("plain", "b", None),  # a draft serving as a target, after the main target's runs
        ("assisted", "b", "a"),
        ("own_plain", "b", None),
        ("own", "b", "a"),
    ]  # unmeasured: as planned
    assert est.seconds(Job("assisted", "T", "b", 16), 16) == pytest.approx(0.5 * 16 * 1.05)
    assert est.seconds(Job("own", "b", "a", 16), 16) is None
    assert run_order(passes_for()[0], est) == list(passes_for()[0].jobs)  # other passes keep the plan


def test_budget_skips_what_would_not_fit_and_says_why():
    """Every run 1 s/token but assisted with draft a, 3 s/token; 120 s of budget. Warm-up (11 s) and the short
    pass (4 tokens, 42 s) fit; in the long pass (16 tokens) the baselines (32 s) and the next cheapest runs
    fit, the runs with draft a (≈50 s each) do not."""
    fake = FakeRunner({("assisted", "a"): 3.0})
    ps = [p for p in passes_for() if p.kind != "spread"]
    runs, gen = run_passes(ps, fake, [[1, 2]] * 2, budget_s=120.0, warmup_tokens=1, progress=False, clock=fake.clock)
    long = runs[runs["pass_kind"] == "long"].set_index(["method", "pair"])
    assert long.loc[("plain", "T"), "status"] == "ok" and long.loc[("plain", "b"), "status"] == "ok"
    assert long.loc[("assisted", "b → T"), "status"] == "ok"
    assert long.loc[("prompt_lookup", "T"), "status"] == "ok"
    for pair in ("a → T", "a → b"):
        skipped = long.loc[("assisted", pair)]
        assert skipped["status"] == "skipped" and "would not fit the wall-time budget: needs ≈50 s" in skipped["error"]
    assert fake.now <= 120.0
    assert (1, Job("assisted", "T", "a", 16)) not in gen
    short = runs[runs["pass_kind"] == "short"]
    assert (short["status"] == "ok").all()


def test_a_run_that_overruns_is_cut_at_the_budget_and_keeps_its_tokens():
    fake = FakeRunner({})  # plain 1 s/token: the first plain run of 16 tokens meets a 10 s budget
    one = [Pass(0, "long", 16, (Job("plain", "T", None, 16), Job("assisted", "T", "a", 16)))]
    runs, gen = run_passes(one, fake, [[1]], budget_s=10.0, warmup_tokens=1, progress=False, clock=fake.clock)
    plain = runs.iloc[0]
    # 2 s of warm-up, 8 s left: 8 tokens
    assert plain["status"] == "cut" and plain["made_tokens"] == 8 and "after 8 of 16" in plain["error"]
    assert runs.iloc[1]["status"] == "skipped" and "budget is spent" in runs.iloc[1]["error"]
    times = times_at_lengths(gen, [4, 8, 16])
    assert sorted(times["length"]) == [4, 8]  # lengths past the tokens it made are not read
    fake = FakeRunner({})  # 0.5 s left after the warm-up: not one token
    runs, gen = run_passes(one[:1], fake, [[1]], budget_s=2.5, warmup_tokens=1, progress=False, clock=fake.clock)
    assert runs.iloc[0]["status"] == "cut" and runs.iloc[0]["made_tokens"] == 0 and not gen


def test_failures_are_rows_and_their_dependents_are_skipped():
    fake = FakeRunner({}, fail={("plain", "b", None)})
    ps = [passes_for()[0]]
    runs, _ = run_passes(ps, fake, [[1]], budget_s=math.inf, warmup_tokens=1, progress=False, clock=fake.clock)
    r = runs.set_index(["method", "pair"])
    assert r.loc[("plain", "b"), "status"] == "oom" and "out of memory" in r.loc[("plain", "b"), "error"]
    assert r.loc[("assisted", "a → b"), "status"] == "skipped"
    assert "no plain generate of b" in r.loc[("assisted", "a → b"), "error"]
    assert r.loc[("assisted", "a → T"), "status"] == "ok"
    warmups = [c for c in fake.calls if c[1] == 1]
    assert len(warmups) == len({j.key for j in ps[0].jobs})  # each job warmed up once
    assert [c for c in fake.calls if c[0] == ("plain", "b", None) and c[1] != 1] == []  # broken: not retried


def test_the_study_budget_leaves_the_reserve_and_honours_the_cap():
    d = Budget(100.0, start=0.0)
    d.start = __import__("time").monotonic() - 30.0  # 30 s spent
    assert d.left_s() == pytest.approx(70.0, abs=0.5)
    assert d.sweep_budget_s(10.0) == pytest.approx(60.0, abs=0.5)
    assert d.sweep_budget_s(10.0, cap_s=20.0) == pytest.approx(20.0)
    d.start -= 100.0
    assert d.sweep_budget_s(10.0) == 0.0
    for bad in (-5, True, "60"):
        with pytest.raises(ValueError):
            Budget(bad)


def test_hf_sdpa_switch_keeps_outputs_and_restores_the_flags():
    q, k, v = (torch.randn(1, 2, n, 8, generator=torch.Generator().manual_seed(n)) for n in (1, 5, 5))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with hf_sdpa("no_cudnn"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.allclose(torch.nn.functional.scaled_dot_product_attention(q, k, v), ref, atol=1e-6)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with hf_sdpa("default"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with pytest.raises(ValueError, match="hf_sdpa"), hf_sdpa("cudnn"):
        pass


def test_first_call_probe_times_each_backend_and_marks_what_cannot_run():
    t = first_call_costs(2, 16, [33, 47], ["math", "cudnn"], device="cpu", repeats=2)
    assert t["backend"].tolist() == ["math", "math", "cudnn", "cudnn"] and t["key_length"].tolist() == [33, 47] * 2
    ok = t[t["backend"] == "math"]
    assert (ok["status"] == "ok").all() and (ok["first_ms"] > 0).all() and (ok["repeat_ms"] > 0).all()
    assert (t[t["backend"] == "cudnn"]["status"] == "unsupported").all()  # no cuDNN attention on the CPU
    text = first_call_summary(t)
    assert text.startswith("**math**: first call at a new key length") and "**cudnn**: cannot run this shape" in text
    fixed = pd.DataFrame(
        [
            dict(backend="cudnn", key_length=n, status="ok", error="", first_ms=f, repeat_ms=0.01)
            for n, f in [(1, 40.0), (2, 50.0), (3, 60.0)]
        ]
    )
    assert first_call_summary(fixed) == ("**cudnn**: first call at a new key length 50.00 ms, again 0.010 ms (5000×).")
    with pytest.raises(ValueError, match="unknown backends"):
        first_call_costs(2, 16, [33], ["xformers"], device="cpu")


def test_coverage_counts_prompts_per_length_and_explains_the_gaps():
    fake = FakeRunner({("assisted", "a"): 3.0})
    ps = [p for p in passes_for() if p.kind != "spread"]
    runs, gen = run_passes(ps, fake, [[1]] * 2, budget_s=120.0, warmup_tokens=1, progress=False, clock=fake.clock)
    times = times_at_lengths(gen, [4, 16])
    cov = analysis.coverage(runs, times, [4, 16]).set_index(["method", "pair"])
    assert cov.loc[("plain", "T"), 4] == 2 and cov.loc[("plain", "T"), 16] == 1
    assert cov.loc[("assisted", "a → T"), 4] == 1 and cov.loc[("assisted", "a → T"), 16] == 0
    assert cov.loc[("plain", "a"), 16] == 0  # a cost run: never planned that long
    assert list(cov.index.get_level_values("method"))[:3] == ["plain"] * 3
    text = analysis.coverage_text(cov.reset_index(), runs, 16, {"assisted": "assistant_model"})
    assert "**Measured at 16 tokens:** plain (T, b)" in text
    assert "assistant_model a → T (skipped: would not fit" in text and "plain a" not in text
    nr = analysis.not_run(runs)
    assert nr["status"].tolist() == ["skipped"] * 2 and nr["pass_kind"].tolist() == ["long"] * 2
    assert analysis.coverage(runs.iloc[:0], times.iloc[:0], [4]).empty
    assert analysis.coverage_text(pd.DataFrame(), runs, 16) == "Nothing was measured at 16 tokens."
