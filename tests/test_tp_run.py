"""The tensor parallel timing (``servelab.cluster.tp_run``): the Beyond-one-GPU page's TP table comes from it on a
machine of several GPUs; here it runs on CPUs over gloo, where only the rows' shape and sense are checked."""

import json

import pandas as pd
import pytest

from servelab.cluster import run_record, tp_run


def test_every_size_batch_and_length_is_timed_into_the_books_layout(tmp_path):
    out = tmp_path / "cpu" / run_record.STUDY / "runs" / "abcabcabcabc" / tp_run.PART / "r1"
    argv = ["config:tiny-llama", "--sizes", "1", "2", "--batches", "1", "2", "--prompt-tokens", "8", "24",
            "--new-tokens", "4", "--samples", "2", "--dtype", "float32", "--device", "cpu", "--repeat", "1",
            "--timeout-s", "300", "--out", str(out)]  # fmt: skip
    assert tp_run.main(argv) == 0
    t = pd.read_csv(out / "samples.csv")
    want = {(tp, b, n, call, k) for tp in (1, 2) for b in (1, 2) for n in (8, 24) for call in ("first", "whole")
            for k in (0, 1)}  # fmt: skip
    assert set(zip(t["tp"], t["batch"], t["prompt_tokens"], t["call"], t["sample"], strict=True)) == want
    assert len(t) == len(want) and (t["ms"] > 0).all() and (t["clock"] == "perf_counter").all()
    # every sequence's greedy tokens, per size: in float32 on CPUs the split gives one process's tokens
    g = pd.read_csv(out / "tokens.csv")
    assert len(g) == 2 * (1 + 2) * 2 and all(len(json.loads(x)) == 4 for x in g["tokens"])
    one, two = (g[g["tp"] == n].set_index(["batch", "prompt_tokens", "sequence"])["tokens"] for n in (1, 2))
    assert one.sort_index().equals(two.sort_index())
    meta = json.loads((out / "run.json").read_text())
    assert meta["complete"] and meta["part"] == "tp" and meta["repeat_index"] == 1 and meta["seed"] == 1
    assert meta["params"]["sizes"] == [1, 2] and meta["device"]["kind"] == "cpu" and len(meta["fingerprint"]) > 12


def test_a_repeat_draws_new_prompts_and_the_same_repeat_the_same():
    one = tp_run.prompts_for(2, 16, 100, seed=0)
    assert one == tp_run.prompts_for(2, 16, 100, seed=0) != tp_run.prompts_for(2, 16, 100, seed=1)
    assert len(one) == 2 and all(len(p) == 16 and min(p) >= 10 and max(p) < 100 for p in one)


@pytest.mark.parametrize(
    "args, match",
    [
        (["--sizes", "0"], ">= 1"),
        (["--new-tokens", "1"], "--new-tokens >= 2"),
        (["--device", "cuda", "--sizes", "1", "8"], "needs as many GPUs"),
    ],
)
def test_bad_settings_are_refused_before_any_model_loads(args, match):
    a = tp_run.build_parser().parse_args(["config:tiny-llama", *args])
    with pytest.raises(tp_run.ParameterError, match=match):
        tp_run.check(a, gpus=1)
