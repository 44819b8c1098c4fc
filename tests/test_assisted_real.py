"""Study 6 on a real pair: the seed shapes' cost ratio, the page's generated text, the models' labels (CPU)."""

from types import SimpleNamespace

import pandas as pd
import pytest

from servelab.studies.common.findings import Finding
from servelab.studies.s06_hf_assisted import report, seed_costs


def test_seed_shape_costs_time_each_model_once_and_divide(monkeypatch):
    calls = []

    def fake(spec, **kw):
        calls.append(spec)
        return {"config:a": 2.0, "config:b": 8.0, "config:c": 4.0}[spec], {"config:a": 1, "config:b": 4, "config:c": 2}[
            spec
        ]

    monkeypatch.setattr(seed_costs, "decode_ms", fake)
    t = seed_costs.seed_shape_costs([("config:a", "config:b"), ("config:c", "config:b")], device="cpu", dtype="float32")
    assert calls == ["config:a", "config:b", "config:c"]  # b, shared, timed once
    assert t["pair"].tolist() == ["a → b", "c → b"]
    assert t["c"].tolist() == [0.25, 0.5] and t["params_ratio"].tolist() == [0.25, 0.5]


def test_seed_shape_costs_run_on_random_tiny_configs():
    import torch

    torch.set_num_threads(1)
    t = seed_costs.seed_shape_costs(
        [("config:tiny-gpt2", "config:tiny-llama")], device="cpu", dtype="float32", tokens=4, repeats=2
    )
    r = t.iloc[0]
    assert r["draft_ms"] > 0 and r["target_ms"] > 0 and r["c"] == pytest.approx(r["draft_ms"] / r["target_ms"])


def _fake_study():
    f = Finding(
        id="F6.1", claim="best pair", seed_value="1.747×", measured_value="1.40", unit="× at 512 tokens",
        verdict="changes", note="best pair d → T at 512 tokens", tested_on="T (135M) | cost at the seed's shapes: x",
    )  # fmt: skip
    real_alpha = pd.DataFrame(
        dict(
            draft=["d2", "self-2L"], kind=["distilled", "self"], alpha=[0.6, 0.1], ci_low=[0.5, 0.05],
            ci_high=[0.7, 0.15], prompts=[48, 48], positions=[5000, 5000], gamma=[4, 4], tokens_per_round=[2.1, 1.1],
        )
    )  # fmt: skip
    speedups = pd.DataFrame(
        dict(
            method=["own", "prompt_lookup"],
            pair=["d2 → T", "T"],
            length=[512, 512],
            speedup_median=[2.5, 1.1],
            prompts=[8, 8],
        )
    )
    return SimpleNamespace(
        findings=[f], tables=dict(real_alpha=real_alpha, speedups=speedups), P=dict(profile="full", n_prompts=8)
    )


def test_the_page_text_comes_from_the_run():
    S = _fake_study()
    v = report.verdict_table(S.findings)
    assert v.loc["F6.1: best pair", "verdict"] == "changes" and "seed's shapes" in v.loc["F6.1: best pair", "tested on"]
    text = report.takeaways(S)
    assert "**F6.1 changes.**" in text and "d2 0.60 [0.50, 0.70]" in text and "2.10 tokens per target forward" in text
    assert "prompt lookup: best T at 512 tokens, 1.10×" in text and "servelab speculative: best d2 → T" in text
    assert report.alpha_detail(S).loc["self-2L", "kind"] == "self"
