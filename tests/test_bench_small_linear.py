"""``scripts/bench_small_linear.py`` runs through on a CPU (``--smoke``: Triton's interpreter, a tiny shape, no
timing worth the name), so a GPU call never spends its minutes on a script that breaks: every path writes its row,
the fused chain's output is the engine chain's to float32 rounding, and the device record lands beside the CSV."""

import json

import pandas as pd
import pytest
from interpreted import run_script_interpreted

pytest.importorskip("triton")


def test_the_smoke_run_writes_every_row_and_the_fused_chain_agrees(tmp_path):
    out = tmp_path / "small_linear.csv"
    run_script_interpreted("bench_small_linear.py", "--smoke", "--rows", "2", "--out", str(out))
    table = pd.read_csv(out)
    chains = table[table["what"] == "layers"].set_index("path")
    assert list(chains.index) == ["engine eager", "fused"]
    assert chains.loc["fused", "max_rel_err"] < 1e-5
    ops = table[table["what"] != "layers"]
    assert sorted(ops["what"].unique()) == ["down_w", "gu_w", "o_w", "qkv_w"]
    assert set(ops["path"]) == {"F.linear", "small_linear"}
    assert (table["ms"] > 0).all() and (table["floor_ms"] > 0).all()
    record = json.loads(out.with_suffix(".device.json").read_text())
    assert record["device"]["kind"] == "cpu" and record["ceilings"]["copy_gb_s"] > 0
