"""Study 6 on a real pair: the seed shapes' cost ratio, the page's generated text, the models' labels (CPU)."""

import pytest

from servelab.studies.s06_hf_assisted import seed_costs


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
