"""Study 1's "How the engine ran": each model's servers and settings, and a sentence where ``torch.compile`` was
refused, with the check's numbers taken from what the servers recorded."""

import pandas as pd

from servelab.studies.s01_scheduling.engines import compile_lines, engine_view

OFF = "off: compiled logits differ from eager by {} (scale {})"
GRAPHS = "on (17 buckets, 16–8192 tokens)"


def servers(rows):
    cols = ["repeat", "model", "compile", "attention_backend", "cuda_graphs", "step_graphs"]
    return pd.DataFrame(rows, columns=cols)


def test_a_model_refused_everywhere_gets_the_checks_numbers_and_one_compiled_gets_none():
    t = servers(
        [
            (0, "config:llama-3-8b", OFF.format(0.341, 6.56), "triton", 14, GRAPHS),
            (1, "config:llama-3-8b", OFF.format(0.404, 6.5), "triton", 14, GRAPHS),
            (0, "config:qwen2-0.5b", "on (max |logit diff| vs eager 0.066)", "triton", 14, GRAPHS),
        ]
    )
    view = engine_view(t).set_index("model")
    assert view.loc["llama-3-8b", "torch.compile"] == "off (2 of 2)"
    assert view.loc["qwen2-0.5b", "torch.compile"] == "on (1 of 1)"
    assert view.loc["llama-3-8b", "servers"] == 2 and view.loc["llama-3-8b", "repeats"] == 2
    text = compile_lines(t)
    assert text.count("ran without `torch.compile`") == 1 and "llama-3-8b" in text and "qwen2" not in text
    assert "0.341–0.404" in text and "6.5–6.56" in text and "5.2–6.2%" in text


def test_a_mixed_model_and_a_refusal_without_numbers():
    t = servers(
        [
            (0, "config:m", "on (max |logit diff| vs eager 0.01)", "triton", 1, GRAPHS),
            (1, "config:m", "off: compile failed: RuntimeError: no compiler", "triton", 1, GRAPHS),
        ]
    )
    assert engine_view(t)["torch.compile"].item() == "on in 1 of 2"
    text = compile_lines(t)
    assert "in 1 of its 2 servers (1 of 2 repeats)." in text and "away from the eager" not in text
    assert compile_lines(servers([])) == "" and engine_view(servers([])).empty
