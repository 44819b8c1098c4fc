"""``scripts/bench_small_batch_step.py`` runs through on a CPU (``--smoke``: Triton's interpreter, tiny-qwen2, float32,
no timing worth the name), so a GPU call never spends its minutes on a script that breaks: each path writes its row,
the small paths' engines (with RoPE and the pool write in the qkv launch, and without) keep their small_linear
blocks and their logits are the default engine's to float32 rounding
(not bitwise: the sums run in another order), and the device record lands beside the CSV."""

import json

import pandas as pd
import pytest
from interpreted import run_script_interpreted

pytest.importorskip("triton")


def test_the_smoke_run_writes_every_path_and_the_small_path_agrees(tmp_path):
    out = tmp_path / "small_batch_step.csv"
    run_script_interpreted("bench_small_batch_step.py", "--smoke", "--out", str(out))
    table = pd.read_csv(out).set_index("path")
    assert list(table.index) == ["unfused", "fused_rope_kv_write", "small_linear", "small_linear_rope_in_qkv"]
    assert (table["status"] == "ok").all(), table.get("note")
    assert table["small_blocks"].tolist() == [False, False, True, True]
    for path in ("small_linear", "small_linear_rope_in_qkv"):
        assert 0 < table.loc[path, "max_rel_diff"] < 1e-5  # another order of sums: close, not bitwise
    assert table.loc["unfused", "max_rel_diff"] == 0 and (table["argmax_agrees"] == "2/2").all()
    assert (table["ms"] > 0).all() and (table["floor_ms"] > 0).all()
    record = json.loads(out.with_suffix(".device.json").read_text())
    assert record["device"]["kind"] == "cpu" and record["ceilings"]["copy_gb_s"] > 0
