"""Study 1's "How the engine ran": each model's servers and settings, and a sentence where ``torch.compile`` was
refused, with the check's numbers taken from what the servers recorded."""

import pandas as pd

from servelab.studies.s01_scheduling.engines import compile_lines, engine_view, launch_lines

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


TUNED = "KEYS={}, warps={}, stages={} (tuned at batch 128 x 1024 keys)"


def test_servers_that_tuned_different_decode_launches_are_counted_and_said():
    """Each server times the decode kernel's launches at startup; where one model's servers chose differently, the
    table counts each launch and a sentence says the repeats' spread includes that draw."""
    t = servers(
        [
            (0, "config:llama-3-8b", "on", "triton", 14, GRAPHS),
            (0, "config:llama-3-8b", "on", "triton", 14, GRAPHS),
            (1, "config:llama-3-8b", "on", "triton", 14, GRAPHS),
            (0, "config:qwen2-0.5b", "on", "triton", 14, GRAPHS),
            (1, "config:qwen2-0.5b", "on", "triton", 14, GRAPHS),
        ]
    ).assign(triton_tuning=[TUNED.format(64, 2, 3), TUNED.format(128, 4, 2), TUNED.format(64, 2, 3)] + [
        TUNED.format(128, 4, 3)] * 2)  # fmt: skip
    view = engine_view(t).set_index("model")["decode kernel launch"]
    assert view["llama-3-8b"] == "KEYS 64, 2 warps, 3 stages (2); KEYS 128, 4 warps, 2 stages (1)"
    assert view["qwen2-0.5b"] == "KEYS 128, 4 warps, 3 stages"
    text = launch_lines(t)
    assert "llama-3-8b's servers ran 2 different decode-kernel launches" in text and "qwen2-0.5b's" not in text
    assert "1 of its 2 repeats with more than one" in text and "batch 128 × 1,024 keys" in text
    assert launch_lines(t[t["model"] == "config:qwen2-0.5b"]) == ""  # one launch: nothing to say


def test_servers_without_a_recorded_launch_read_not_recorded():
    t = servers([(0, "config:m", "on", "triton", 1, GRAPHS)])
    assert engine_view(t)["decode kernel launch"].item() == "not recorded" and launch_lines(t) == ""
