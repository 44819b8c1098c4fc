"""The scripts that chose the ragged kernel's packed-tile size (issue 29), run on a CPU.

``bench_ragged_tiles.py`` under Triton's interpreter: every tile size and launch it times must give the same
attention (the choice rests on their times alone). ``kernel_registers.py``: the engine's launch, compiled for sm90
here, must not spill (the 128-row launch it replaced did). ``bench_ragged_tiles_offline.py`` on a tiny model: a
row per (budget, tile size, run), every request's tokens produced.
"""

import subprocess
import sys

import pandas as pd
import pytest
from interpreted import ROOT, run_script_interpreted

from servelab.kernels.ragged import ragged_tile_tokens


def test_every_tile_size_and_launch_gives_the_same_attention(tmp_path):
    out = tmp_path / "tiles.csv"
    run_script_interpreted("bench_ragged_tiles.py", "--smoke", "--out", str(out))
    table = pd.read_csv(out)
    assert set(table["path"]) >= {"packed@16", "packed@2", "apart@2", "decode"}
    # the decode graph's kernel runs on the steps of decodes alone, and only there
    assert set(table.loc[table["path"] == "decode", "case"]) == {"3 decodes alone"}
    apart = table[table["path"].str.startswith("apart")].set_index("case")["launches"]
    assert apart["2 decodes at 40 + a 20 chunk"] == 2 and apart["3 decodes alone"] == 1  # the decodes, then the chunk
    assert (table["max_abs_diff"] < 1e-4).all(), table  # float32: the same sums, rounded in another order at most


def test_the_engine_tile_launch_does_not_spill_on_sm90(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "registers.csv"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kernel_registers.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_csv(out).set_index("tile_tokens")
    assert "error" not in table or table["error"].isna().all(), table
    engine = table.loc[ragged_tile_tokens(14, 2)]  # Qwen2-0.5B's shape, the engine's launch (4 warps, 64 keys)
    assert engine["rows"] == 16 and engine["stack_bytes"] == 0 and engine["registers"] <= 255
    assert table.loc[16, "stack_bytes"] > 0  # the 128-row tile it replaced spills: the check can tell


def test_the_offline_bench_runs_every_setting(tmp_path):
    out = tmp_path / "offline.csv"
    args = ["--device", "cpu", "--model", "config:tiny-qwen2", "--num-requests", "3", "--max-len", "20"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_ragged_tiles_offline.py"), *args, "--runs", "2",
         "--budgets", "default,32", "--tiles", "16,2", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_csv(out)
    assert len(table) == 2 * 2 * 2  # budgets x tile sizes x runs
    assert table.groupby(["budget", "tile_tokens"]).size().eq(2).all()
    assert (table["tok_s"] > 0).all() and table["output_tokens"].nunique() == 1
