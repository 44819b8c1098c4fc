"""Study 6's library: the token clock, timed generate runs, the sweep, speedups, verdicts, parameters."""

import numpy as np
import pandas as pd
import pytest
import torch
from test_speculative_loop import tiny_llama

from servelab.errors import ParameterError
from servelab.studies.s06_hf_assisted import analysis, verdicts
from servelab.studies.s06_hf_assisted.acceptance import greedy_agreement
from servelab.studies.s06_hf_assisted.clock import TokenClock, per_token_ms, time_to_tokens
from servelab.studies.s06_hf_assisted.params import pairs_for, study_params
from servelab.studies.s06_hf_assisted.runs import (
    Job,
    Pair,
    assistant_settings,
    plan_jobs,
    timed_generate,
    times_at_lengths,
)
from servelab.studies.s06_hf_assisted.sweep import sweep

VOCAB = 96


def _llama(layers, d, seed, vocab=VOCAB):
    """A random tiny Llama whose token 0 begins and ends a text, and 1 pads."""
    return tiny_llama(seed, layers, vocab, d, bos_token_id=0, eos_token_id=0, pad_token_id=1)


@pytest.fixture(scope="module")
def models():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster and does not stall on a busy box
    yield {"target": _llama(2, 32, 0), "small": _llama(1, 16, 1), "mid": _llama(1, 32, 2)}
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, VOCAB, (12,), generator=g).tolist() for _ in range(3)]


def _sweep(models, pairs, prompts, max_new_tokens, cost_tokens=4, lookup_targets=(), warmup_tokens=2, **kw):
    """``sweep`` as these tests run it: 3 prompt-lookup tokens, pad id 1, no progress bar."""
    return sweep(
        models,
        pairs,
        prompts,
        max_new_tokens=max_new_tokens,
        cost_tokens=cost_tokens,
        prompt_lookup_targets=list(lookup_targets),
        pld_tokens=3,
        warmup_tokens=warmup_tokens,
        pad_token_id=1,
        progress=False,
        **kw,
    )


def test_clock_skips_the_prompt_and_accumulates_tokens():
    clock = TokenClock(cuda=False)
    with pytest.raises(RuntimeError):
        clock.put(torch.zeros(1, 5))
    clock.start()
    clock.put(torch.zeros(1, 12))  # the prompt
    for k in (1, 3, 1):
        clock.put(torch.zeros(1, k))
    clock.end()
    counts, ms = clock.marks()
    assert counts.tolist() == [1, 4, 5] and clock.ended
    assert np.all(np.diff(ms) >= 0) and ms[0] >= 0


def test_time_to_tokens_reads_the_first_mark_at_or_past_k():
    counts, ms = np.array([1, 4, 5, 9]), np.array([10.0, 20.0, 25.0, 40.0])
    assert time_to_tokens(counts, ms, 1) == 10.0
    assert time_to_tokens(counts, ms, 2) == 20.0
    assert time_to_tokens(counts, ms, 9) == 40.0
    assert np.isnan(time_to_tokens(counts, ms, 10))
    assert per_token_ms(counts, ms).tolist() == pytest.approx([10 / 3, 5.0, 15 / 4])


def test_assisted_and_prompt_lookup_runs_equal_plain_greedy(models, prompts):
    plain = timed_generate(models["target"], prompts[0], 20, pad_token_id=1)
    assisted = timed_generate(models["target"], prompts[0], 20, assistant=models["small"], pad_token_id=1)
    lookup = timed_generate(models["target"], prompts[0], 20, prompt_lookup_num_tokens=3, pad_token_id=1)
    assert len(plain.tokens) == 20 and plain.counts[-1] == 20 and plain.counts.tolist() == list(range(1, 21))
    assert assisted.tokens == plain.tokens and lookup.tokens == plain.tokens
    assert assisted.counts[-1] == 20 and len(assisted.counts) <= 20  # several tokens per target step at times
    assert plain.total_ms > 0


def test_plan_puts_the_main_target_first_and_own_last():
    pairs = pairs_for("T", ["a", "b", "c"])
    assert [p.name for p in pairs] == ["a → T", "b → T", "c → T", "a → c"]
    jobs = plan_jobs(pairs, 64, 16, ["T"], own=True)
    assert jobs[0] == Job("plain", "T", None, 64)
    assert [j for j in jobs if j.method == "plain" and j.new_tokens == 16] == [
        Job("plain", "a", None, 16),
        Job("plain", "b", None, 16),
    ]
    methods = [j.method for j in jobs]
    assert methods.index("prompt_lookup") < methods.index("own_plain") < methods.index("own")
    assert Job("plain", "c", None, 64) in jobs and Job("assisted", "c", "a", 64) in jobs
    assert methods[-4:] == ["own"] * 4


def test_sweep_times_every_method_and_checks_outputs(models, prompts):
    pairs = [Pair("small", "target"), Pair("mid", "target"), Pair("small", "mid")]
    runs, gen = _sweep(models, pairs, prompts[:2], 16, cost_tokens=8, lookup_targets=["target"])
    assert (runs["status"] == "ok").all()
    assert runs["prompt"].nunique() == 2
    assert set(runs["method"]) == {"plain", "assisted", "prompt_lookup"}
    nonplain = runs[runs["method"] != "plain"]
    assert (nonplain["matches_plain"] == 1.0).all() and (nonplain["matching_prefix"] == 1.0).all()
    assert runs[runs["method"] == "plain"]["matches_plain"].isna().all()
    times = times_at_lengths(gen, [4, 8, 16])
    assert set(times["length"]) == {4, 8, 16}
    assert (times[times.method != "plain"]["length"] <= 16).all()
    per = times.groupby(["prompt", "method", "pair"])["ms"].apply(lambda s: s.is_monotonic_increasing)
    assert per.all()
    assert times[(times.pair == "small") & (times.method == "plain")]["length"].max() == 8  # cost_tokens run


def test_prompts_run_short_then_long_then_short(models, prompts):
    runs, gen = _sweep(models, [Pair("small", "target")], prompts, 12, short_new_tokens=6)
    assert (runs["status"] == "ok").all()
    made = runs.set_index(["prompt", "method", "pair"])["made_tokens"]
    assert made[(0, "plain", "target")] == 6 and made[(0, "plain", "small")] == 4  # the draft's cost run
    assert made[(1, "plain", "target")] == 12 and made[(1, "assisted", "small → target")] == 12
    assert (1, "plain", "small") not in made.index  # the long pass has no cost-only runs
    assert made[(2, "assisted", "small → target")] == 6 and made[(2, "plain", "small")] == 4
    assert runs.groupby("prompt")["pass_kind"].first().tolist() == ["short", "long", "spread"]
    times = times_at_lengths(gen, [6, 12])
    assert times[times.length == 12]["prompt"].unique().tolist() == [1]
    assert sorted(times[(times.length == 6) & (times.method == "assisted")]["prompt"]) == [0, 1, 2]


def test_sweep_budget_skips_with_a_reason_and_records_failures(models, prompts):
    bad = {"target": models["target"], "alien": _llama(1, 16, 3, vocab=50)}  # a draft with another vocabulary
    runs, gen = _sweep(bad, [Pair("alien", "target")], prompts, 8, budget_s=0.0)
    assert not gen and (runs["status"] == "skipped").all() and runs["error"].str.len().gt(0).all()
    assert runs["prompt"].tolist() == [0] * 3 + [1] * 3 + [2] * 3  # every planned run has its row
    assert runs["error"].str.contains("budget is spent").all()  # the root cause, not the missing baseline
    runs2, _ = _sweep(bad, [Pair("alien", "target")], prompts[:1], 8)
    assert (runs2[runs2.method == "assisted"]["status"] == "error").all()
    assert (runs2[(runs2.method == "plain") & (runs2.target == "target")]["status"] == "ok").all()


def test_alpha_table_covers_each_pair_on_each_plain_target_run(models, prompts):
    from servelab.studies.s06_hf_assisted.acceptance import alpha_table

    pairs = [Pair("small", "target"), Pair("target", "mid")]
    runs, gen = _sweep(models, pairs, prompts[:2], 6, warmup_tokens=1)
    t = alpha_table(models, pairs, prompts[:2], gen)
    assert sorted(zip(t["prompt"], t["pair"], strict=True)) == [
        (0, "small → target"),
        (0, "target → mid"),
        (1, "small → target"),
        (1, "target → mid"),
    ]
    assert t["alpha"].between(0, 1).all() and (t["tokens"] == 6).all()


def test_greedy_agreement_is_one_for_the_target_itself(models, prompts):
    out = timed_generate(models["target"], prompts[0], 12, pad_token_id=1).tokens
    assert greedy_agreement(models["target"], prompts[0], out) == 1.0
    a = greedy_agreement(models["small"], prompts[0], out)
    assert 0.0 <= a < 1.0
    with pytest.raises(ValueError):
        greedy_agreement(models["small"], prompts[0], [])


def test_speedups_pair_each_method_with_plain_on_the_same_prompt():
    rows = []
    for prompt, (plain, fast) in enumerate([(100.0, 50.0), (120.0, 40.0), (90.0, 90.0)]):
        rows += [
            dict(prompt=prompt, method="plain", target="T", draft="", pair="T", length=8, ms=plain),
            dict(prompt=prompt, method="assisted", target="T", draft="d", pair="d → T", length=8, ms=fast),
        ]
    per = analysis.speedups(pd.DataFrame(rows))
    assert per["speedup"].tolist() == pytest.approx([2.0, 3.0, 1.0])
    s = analysis.summarize_speedups(per).iloc[0]
    assert s["speedup_median"] == pytest.approx(2.0) and s["prompts"] == 3
    assert s["speedup_p25"] == pytest.approx(1.5) and s["speedup_p75"] == pytest.approx(2.5)


def test_own_speedup_is_against_the_engine_running_the_target_alone():
    times = pd.DataFrame(
        [
            dict(prompt=0, method="plain", target="T", draft="", pair="T", length=8, ms=100.0),
            dict(prompt=0, method="own_plain", target="T", draft="", pair="T", length=8, ms=20.0),
            dict(prompt=0, method="own", target="T", draft="d", pair="d → T", length=8, ms=10.0),
            dict(prompt=0, method="own", target="T", draft="d", pair="d → T", length=4, ms=5.0),
        ]
    )  # no baseline at 4
    t = analysis.own_vs_engine(times)
    assert t[["method", "length"]].values.tolist() == [["own", 8]] and t["speedup_median"].iloc[0] == pytest.approx(2.0)
    hf = analysis.summarize_speedups(analysis.speedups(times)).set_index("method")
    assert hf.loc["own_plain", "speedup_median"] == pytest.approx(5.0)


def _pairs_table(speedups, cost_ratios, alphas, length=512, prompts=verdicts.MIN_PROMPTS):
    return pd.DataFrame(
        dict(
            pair=[f"p{i}" for i in range(len(speedups))],
            speedup_median=speedups,
            speedup_p25=np.array(speedups) - 0.1,
            speedup_p75=np.array(speedups) + 0.1,
            prompts=prompts,
            cost_ratio=cost_ratios,
            alpha=alphas,
            length=length,
        )
    )


def _per_prompt(per_pair_by_length, lengths=(32, 128, 512), prompts=(0,)):
    rows = []
    for pair, values in per_pair_by_length.items():
        for prompt in prompts:
            for length, v in zip(lengths, values, strict=True):
                rows.append(dict(method="assisted", pair=pair, prompt=prompt, length=length, speedup=v))
    return pd.DataFrame(rows)


def test_f61_verdict_rules():
    assert verdicts.f61_best_pair(_pairs_table([1.2, 1.8, 0.9], [0.3, 0.2, 0.6], [0.6, 0.7, 0.5])).verdict == "holds"
    r = verdicts.f61_best_pair(_pairs_table([1.1, 1.2], [0.3, 0.2], [0.6, 0.7]))
    assert r.verdict == "changes" and r.measured_value == "1.20" and "below" in r.note
    assert r.headline == pytest.approx(1.2) and "best pair's median speedup" in r.headline_unit
    assert verdicts.f61_best_pair(_pairs_table([0.8, 0.95], [0.3, 0.2], [0.6, 0.7])).verdict == "fails"
    assert verdicts.f61_best_pair(_pairs_table([], [], [])).measured_value == "not measured"


def test_f61_uses_the_longest_length_any_pair_reached():
    """Only one of three pairs ran to 512 tokens: F6.1 is that pair at 512, not the best pair at 128."""
    short = _pairs_table([1.9, 1.2, 1.1], [0.2, 0.3, 0.5], [0.7, 0.6, 0.5], length=128)
    long = _pairs_table([1.3, np.nan, np.nan], [0.2, 0.3, 0.5], [0.7, 0.6, 0.5], length=512)
    r = verdicts.f61_best_pair(pd.concat([short, long]))
    assert r.measured_value == "1.30" and r.unit == "× at 512 tokens" and "1 pairs reached 512 tokens" in r.note
    r = verdicts.f61_best_pair(short)
    assert r.unit == "× at 128 tokens" and "RTX 2070's figure is at 512" in r.note
    assert verdicts.ranking_length(pd.concat([short, long])) == 128  # 3 pairs at 128, 1 at 512
    assert verdicts.ranking_length(long) is None


def test_f62_verdict_rules():
    rising = {"p0": [1.0, 1.2, 1.4], "p1": [0.9, 1.0, 1.2], "p2": [0.7, 0.8, 0.9]}
    flat = {k: [v[-1]] * 3 for k, v in rising.items()}
    falls_with_c = _pairs_table([1.4, 1.2, 0.9], [0.2, 0.4, 0.7], [0.6, 0.6, 0.6])
    rises_with_c = _pairs_table([1.4, 1.2, 0.9], [0.7, 0.4, 0.2], [0.6, 0.6, 0.6])
    assert verdicts.f62_what_decides(falls_with_c, _per_prompt(rising)).verdict == "holds"
    r = verdicts.f62_what_decides(falls_with_c, _per_prompt(flat))
    assert r.verdict == "changes" and "hardly moves" in r.note
    r = verdicts.f62_what_decides(rises_with_c, _per_prompt(flat))
    assert r.verdict == "fails" and "rises with c" in r.note
    assert verdicts.f62_what_decides(falls_with_c.head(2), _per_prompt(rising)).measured_value == "not measured"
    rows = verdicts.findings(falls_with_c, _per_prompt(rising))
    assert [r.id for r in rows] == ["F6.1", "F6.2"]
    assert rows[1].headline == pytest.approx(-1.0) and "cost ratio c" in rows[1].headline_unit  # ρ_c decides
    from servelab.measure.results import findings_frame

    assert len(findings_frame([r.row() for r in rows])) == 2


def test_f62_short_of_pairs_says_how_many_prompts_each_pair_had():
    # F6.2's third repeat: a budget left two of three pairs one prompt short; the note said "got 1 pair" and no more
    table = _pairs_table([1.4, 1.2, 0.9], [0.2, 0.4, 0.7], [0.6, 0.6, 0.6])
    table["prompts"] = [verdicts.MIN_PROMPTS, verdicts.MIN_PROMPTS - 1, verdicts.MIN_PROMPTS - 1]
    rising = {"p0": [1.0, 1.2, 1.4], "p1": [0.9, 1.0, 1.2], "p2": [0.7, 0.8, 0.9]}
    r = verdicts.f62_what_decides(table, _per_prompt(rising))
    n = verdicts.MIN_PROMPTS
    assert r.verdict == "inconclusive"
    assert r.note.startswith(f"at 512 tokens, 1 of 3 pairs ran on ≥ {n} prompts (p0: {n}; p1: {n - 1}; p2: {n - 1}).")
    # two pairs in all: the rule could not rank them whatever their prompts, and the note says that instead
    two = verdicts.f62_what_decides(table.head(2), _per_prompt(rising))
    assert two.verdict == "inconclusive" and not two.note.startswith("at 512 tokens")


def test_length_trend_compares_the_same_prompts_at_every_length():
    """The long prompt reached 512 and speeds up with length; the short prompts (fast at 32–128) must not be
    mixed into the trend, or the median at 32–128 would come from other prompts than the one at 512."""
    long_prompt = _per_prompt({"p": [1.0, 1.1, 1.3]}, prompts=(1,))
    short_prompts = _per_prompt({"p": [2.0, 2.0]}, lengths=(32, 128), prompts=(0, 2))
    t = verdicts.length_trends(pd.concat([long_prompt, short_prompts])).iloc[0]
    assert t["prompts"] == 1 and t["lengths"] == 3
    assert t["rho"] == pytest.approx(1.0) and t["change"] == pytest.approx(0.3)
    assert verdicts.length_trends(short_prompts).empty  # two lengths are no trend


def test_decode_costs_and_pair_summary(models):
    runs = pd.DataFrame(  # two plain runs (per-token median and quartiles), then an assisted one
        dict(
            method=["plain", "plain", "assisted"],
            target=["target", "small", "target"],
            status="ok",
            ms_per_token_median=[10.0, 4.0, np.nan],
            ms_per_token_p25=[9.0, 3.0, np.nan],
            ms_per_token_p75=[11.0, 5.0, np.nan],
            pair=[np.nan, np.nan, "small → target"],
            tokens_per_step=[np.nan, np.nan, 2.5],
        )
    )
    costs = analysis.decode_costs(runs, models)
    assert costs["model"].tolist() == ["target", "small"]
    summ = pd.DataFrame(
        [
            dict(
                method="assisted",
                pair="small → target",
                length=16,
                speedup_median=1.3,
                speedup_p25=1.2,
                speedup_p75=1.4,
                prompts=2,
            )
        ]
    )
    alpha = pd.DataFrame([dict(prompt=0, pair="small → target", alpha=0.5)])
    t = analysis.pair_summary([Pair("small", "target")], costs, summ, alpha, runs, 16).iloc[0]
    assert t["cost_ratio"] == pytest.approx(0.4) and t["alpha"] == 0.5 and t["tokens_per_step"] == 2.5
    assert t["speedup_median"] == 1.3 and t["length"] == 16
    assert 0 < t["params_ratio"] < 1
    by_length = analysis.pair_summary([Pair("small", "target")], costs, summ, alpha, runs, [8, 16])
    assert by_length["length"].tolist() == [8, 16] and np.isnan(by_length["speedup_median"].iloc[0])
    assert (by_length["cost_ratio"] == t["cost_ratio"]).all()


def test_parameters_are_validated():
    p = study_params("smoke")
    assert p["max_new_tokens"] in p["lengths"] and p["profile"] == "smoke"
    assert study_params("smoke", lengths=[2, 4])["lengths"] == [2, 4, p["max_new_tokens"]]
    full = study_params("full")
    assert full["max_new_tokens"] == 512 and 512 in full["lengths"] and full["hf_sdpa"] == "no_cudnn"
    # 340-360 s a part (f62_thin_repeat.md): a slow process still times its three prompts; the job's own limit keeps a
    # part with the drafts' distillation under 9 minutes
    assert 340 <= full["wall_budget_s"] <= 360 and full["budget_s"] is None
    from servelab.studies.s06_hf_assisted.params import JOB_LIMIT_S, REPORT_RESERVE_S

    assert full["wall_budget_s"] + REPORT_RESERVE_S < JOB_LIMIT_S <= 9 * 60 - 30
    assert full["n_prompts"] >= verdicts.MIN_PROMPTS and full["short_new_tokens"] == full["max_new_tokens"]
    assert full["alpha_prompts"] >= 32 and full["seed_cost_pairs"][0] == ("config:distilgpt2", "config:gpt2-medium")
    with pytest.raises(ParameterError, match="drafts need a target"):
        study_params("smoke", drafts=["gpt2"])
    with pytest.raises(ParameterError, match="drafts must be"):
        study_params("smoke", target="gpt2-medium")
    with pytest.raises(ParameterError, match="draft>target"):
        study_params("smoke", seed_cost_pairs=["gpt2"])
    with pytest.raises(ParameterError, match="no shipped config"):
        study_params("smoke", seed_cost_pairs=["gpt2>gpt5"])
    with pytest.raises(ParameterError, match="drafts"):
        study_params("smoke", target="gpt2-medium", drafts=[])
    with pytest.raises(ParameterError, match="target cannot"):
        study_params("smoke", target="gpt2", drafts=["gpt2"])
    with pytest.raises(ParameterError, match="lengths"):
        study_params("smoke", lengths=[1000])
    with pytest.raises(ParameterError, match="cost_tokens"):
        study_params("smoke", cost_tokens=12, short_new_tokens=8, max_new_tokens=16)
    with pytest.raises(ParameterError, match="unknown"):
        study_params("smoke", gamma=3)
    with pytest.raises(ParameterError, match="unknown"):
        study_params("smoke", followup_new_tokens=8)  # renamed: short_new_tokens
    with pytest.raises(ParameterError, match="short_new_tokens"):
        study_params("smoke", short_new_tokens=64, max_new_tokens=16)
    with pytest.raises(ParameterError, match="budget_s"):
        study_params("smoke", budget_s=-1)
    with pytest.raises(ParameterError, match="wall_budget_s"):
        study_params("smoke", wall_budget_s=0)
    with pytest.raises(ParameterError, match="hf_sdpa"):
        study_params("smoke", hf_sdpa="cudnn_only")
    assert study_params("smoke", budget_s=30)["budget_s"] == 30
    with pytest.raises(ParameterError, match="need at least one draft"):
        pairs_for("T", [])


def test_assistant_settings_fall_back_to_hf_defaults(models):
    s = assistant_settings(models["small"])
    assert set(s) == {"num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"}
    assert isinstance(s["num_assistant_tokens"], int) and s["num_assistant_tokens"] > 0


def test_analysis_plots_and_verdicts_survive_a_sweep_where_nothing_ran(models, prompts):
    import matplotlib

    matplotlib.use("Agg")
    from servelab.studies.s06_hf_assisted import plots

    pairs = [Pair("small", "target"), Pair("mid", "target"), Pair("small", "mid")]
    runs, gen = _sweep(models, pairs, prompts[:1], 8, lookup_targets=["target"], warmup_tokens=1, budget_s=0.0)
    assert (runs["status"] == "skipped").all() and not gen
    times = times_at_lengths(gen, [4, 8])
    per_prompt = analysis.speedups(times)
    summary = analysis.summarize_speedups(per_prompt)
    costs = analysis.decode_costs(runs, models)
    table = analysis.pair_summary(
        pairs, costs, summary, pd.DataFrame(columns=["prompt", "pair", "alpha"]), runs, [4, 8]
    )
    assert summary.empty and costs.empty and table["cost_ratio"].isna().all()
    assert analysis.match_rates(runs).empty
    cov = analysis.coverage(runs, times, [4, 8])
    assert len(cov) == runs[["method", "pair"]].drop_duplicates().shape[0] and (cov[[4, 8]] == 0).all().all()
    text = analysis.coverage_text(cov, runs, 8)
    assert "nothing" in text and "budget is spent" in text
    for fig in (
        plots.speedup_vs_length(summary, "cpu"),
        plots.cost_vs_params(table, "cpu"),
    ):
        assert fig is not None
    rows = verdicts.findings(table, per_prompt)
    assert [r.id for r in rows] == ["F6.1", "F6.2"]  # each claim has its row: all() below is not over nothing
    assert all(r.measured_value == "not measured" and r.verdict == "inconclusive" for r in rows)


def test_models_from_specs_load_with_their_tokenizer_and_heldout_prompts(tmp_path, monkeypatch):
    """The reader-with-a-network path (hub ids), with local directories standing in for hub models."""
    from servelab.studies.common.family.train import train_tokenizer
    from servelab.studies.s06_hf_assisted import models as study_models

    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "class A:\n    pass\n" * 50], 300)
    specs = {}
    for name, (layers, d) in {"big": (2, 32), "tiny": (1, 16), "mid": (1, 24)}.items():
        m = _llama(layers, d, seed=layers * d, vocab=len(tok))
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        specs[name] = str(tmp_path / name)
    src = tmp_path / "site"  # a small corpus root instead of the whole site-packages (speed)
    src.mkdir()
    for i in range(30):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    monkeypatch.setattr("servelab.studies.common.family.corpus.default_roots", lambda: {"site-packages": src})
    sm = study_models.load_study_models(
        specs["big"], [specs["mid"], specs["tiny"]], profile="smoke", dtype="float32", device="cpu"
    )
    assert sm.target == "big" and sm.drafts == ["tiny", "mid"] and sm.source == "specs"
    assert sm.pad_token_id is not None
    ps = sm.prompts(2, 16, seed=0)
    assert len(ps) == 2 and all(len(p) == 16 and max(p) < len(tok) for p in ps)
    with pytest.raises(ParameterError, match="vocabularies differ"):
        other = _llama(1, 16, 9, vocab=77)
        other.save_pretrained(tmp_path / "other")
        study_models.load_study_models(
            specs["big"], [str(tmp_path / "other")], profile="smoke", dtype="float32", device="cpu"
        )


def test_own_acceptance_sums_over_runs():
    runs = pd.DataFrame(  # one run a prompt; the third failed and has no counts
        dict(
            method="own",
            status=["ok", "ok", "error"],
            pair="a → T",
            prompt=[0, 1, 2],
            accepted=[6, 2, np.nan],
            proposed=[8, 8, np.nan],
            rounds=[4, 4, np.nan],
            rollback_ms=[1.0, 1.0, np.nan],
            total_ms=[10.0, 30.0, np.nan],
        )
    )
    t = analysis.own_acceptance(runs).iloc[0]
    assert t["runs"] == 2 and t["alpha"] == pytest.approx(0.5) and t["rollback_share"] == pytest.approx(0.05)
    assert analysis.own_acceptance(runs[runs.method == "x"]).empty
    # the engine's mode has no rollback phase to time (own_engine: NaN): none, not 0 ms
    engine = analysis.own_acceptance(runs.assign(rollback_ms=np.nan)).iloc[0]
    assert np.isnan(engine["rollback_ms"]) and np.isnan(engine["rollback_share"]) and engine["alpha"] == 0.5


def test_a_speedup_counts_only_over_enough_prompts_and_both_subjects_are_labelled():
    """F6.1 on one prompt is no verdict; with enough prompts it speaks of the real pair and of the seed's shapes."""
    one = _pairs_table([1.9, 1.2, 1.1], [0.2, 0.3, 0.5], [0.7, 0.6, 0.5], prompts=1)
    assert verdicts.f61_best_pair(one).verdict == "inconclusive"
    assert verdicts.ranking_length(one) is None
    seed = pd.DataFrame([dict(pair="distilgpt2 → gpt2-medium", c=0.5)])
    r = verdicts.f61_best_pair(_pairs_table([1.9, 1.2], [0.2, 0.3], [0.7, 0.6]), seed, tested_on="SmolLM2 (135M)")
    assert r.tested_on.startswith("SmolLM2 (135M) | cost at the seed's shapes: distilgpt2 → gpt2-medium")
    g, imp = verdicts.best_gamma(0.7, 0.5)
    assert f"c = 0.50, predicted {imp:.2f}× at γ = {g}" in r.note
    assert verdicts.min_prompts_for("smoke", 2) == 2 and verdicts.min_prompts_for("full", 2) == verdicts.MIN_PROMPTS


def test_f61s_failing_note_says_prompt_lookup_pays_where_it_does():
    # 2026-12: "assisted generation does not pay here" stood beside prompt lookup, the same API's draft-free mode, at
    # 1.99x plain generate
    pairs = _pairs_table([0.8, 0.95], [0.3, 0.2], [0.6, 0.7])
    lookup = pd.DataFrame({"method": "prompt_lookup", "pair": "T", "prompt": range(8), "length": 512, "speedup": 2.0})
    r = verdicts.f61_best_pair(pairs, per_prompt=lookup)
    assert r.verdict == "fails" and "no assistant_model pair beats plain generate" in r.note
    assert "prompt lookup, HF's draft-free assisted mode, does: 2.00× at 512 tokens" in r.note
    slow = lookup.assign(speedup=0.9)
    assert "prompt lookup" not in verdicts.f61_best_pair(pairs, per_prompt=slow).note


def test_f62s_note_says_how_often_chance_alone_lets_c_decide():
    # with 3 pairs ρ takes only ±1 and ±0.5, and half of the orderings reach the rule's −0.5
    assert verdicts.chance_orderings(3) == (3, 6)
    assert verdicts.chance_orderings(4)[1] == 24
    falls_with_c = _pairs_table([1.4, 1.2, 0.9], [0.2, 0.4, 0.7], [0.6, 0.6, 0.6])
    rising = {"p0": [1.0, 1.2, 1.4], "p1": [0.9, 1.0, 1.2], "p2": [0.7, 0.8, 0.9]}
    note = verdicts.f62_what_decides(falls_with_c, _per_prompt(rising)).note
    assert "over 3 pairs, 3 of the 6 possible orderings give ρ ≤ −0.5 by chance alone" in note


def test_clock_marks_what_an_engine_step_made():
    """``mark`` books new tokens as ``put`` does, without a prompt to skip: the engine rows' steps."""
    clock = TokenClock(cuda=False)
    with pytest.raises(RuntimeError, match="start"):
        clock.mark(1)
    clock.start()
    for k in (1, 4, 0, 2):
        clock.mark(k)
    counts, ms = clock.marks()
    assert counts.tolist() == [1, 5, 5, 7] and np.all(np.diff(ms) >= 0)
