"""``scripts/bench_spec_engine.py`` runs through on a CPU with tiny models, so a GPU call never spends its minutes on a
script that breaks: every quantity gets its row at each batch, c and v come out positive, the controlled runs keep
the plain engine's tokens (no warning), the device record lands beside the CSV, and ``--profile`` reads where each
phase's time goes."""

import json
import os
import subprocess
import sys

import pandas as pd

from servelab.paths import REPO_ROOT


def bench(out, *args, **env) -> None:
    """The bench on a CPU with tiny-llama as target and draft, writing ``out``: it exits 0 and warns of nothing (a
    warning says the controlled runs left the plain engine's tokens)."""
    script = REPO_ROOT / "scripts" / "bench_spec_engine.py"
    tiny = ["--target", "config:tiny-llama", "--draft", "config:tiny-llama", "--device", "cpu"]
    run = subprocess.run(
        [sys.executable, str(script), *tiny, *args, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "lib"), "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "warning" not in run.stdout


def test_a_cpu_run_writes_every_row_and_the_device_record(tmp_path):
    out = tmp_path / "spec_engine.csv"
    bench(out, "--new", "10", "--profile", "--batch", "1", "3", "--alpha", "0.5", "1.0", "--seeds", "2")
    table = pd.read_csv(out, dtype={"seed": str})
    for b in (1, 3):
        rows = table[table["batch"] == b]
        assert {"plain decode step ms", "draft round ms", "verify step ms"} <= set(rows["what"])
        assert (rows[rows["what"].str.startswith(("c (", "v ("))]["value"] > 0).all()
        speedups = rows[rows["what"] == "speed-up"]
        # a row per seed's controlled run, and their median with its low and high
        assert sorted(speedups["seed"]) == ["0", "0", "1", "1", "median", "median"]
        assert (speedups["value"] > 0).all()
        medians = speedups[speedups["seed"] == "median"]
        assert sorted(medians["alpha"]) == [0.5, 1.0] and (medians["low"] <= medians["value"]).all()
        assert (medians["value"] <= medians["high"]).all()
        full = rows[(rows["what"] == "acceptance") & (rows["alpha"] == 1.0)]["value"]
        assert (full == 1.0).all()  # every draft overridden to the target's own token is kept, whatever the seed
        lengths = rows[(rows["what"] == "tokens per speculative step") & (rows["alpha"] == 1.0)]["value"]
        assert ((lengths > 1) & (lengths <= 5)).all()  # kept drafts + the target's token, at most γ + 1
        for what in ("speed-up / Leviathan at these draws", "speed-up / Leviathan at these steps"):
            ratio = rows[rows["what"] == what]["value"]
            assert len(ratio) == 6 and (ratio > 0).all(), what
        # a batch runs at least as many speculative steps as its mean request needs (it waits for the slowest)
        tails = rows[rows["what"] == "steps over the mean request's"]["value"]
        assert len(tails) == 6 and (tails >= 1).all()
    record = json.loads(out.with_suffix(".device.json").read_text())
    assert record["device"]["kind"] == "cpu" and record["args"]["gamma"] == 4
    budget = pd.read_csv(out.with_suffix(".budget.csv"))  # --profile: each phase's time, read as a step budget
    assert len(budget) == 6 and set(budget["phase"]) == {"plain decode step", "draft round", "verify step"}
    assert (budget["calls"] > 0).all() and (budget["wall_ms"] > 0).all() and (budget["gemm_kernels"] > 0).all()


def test_a_cpu_run_with_the_switches_on_runs_the_draft_through_small_linear_and_says_so(tmp_path):
    """``--switches on`` under Triton's interpreter: both engines take the fused RoPE + KV write and small_linear's
    one-row steps, and the draft takes them from the target (nobody sets them on it by hand), so the bench runs
    through with the draft's one-row steps on small_linear's kernels (after its runner compiled and captured), and the
    record says so. Whether that path gives HF's tokens is ``tests/test_small_batch_blocks.py``'s question."""
    out = tmp_path / "spec_engine.csv"
    args = ["--new", "4", "--gamma", "2", "--prompt", "16", "--switches", "on", "--batch", "1", "--alpha", "1.0"]
    bench(out, *args, "--seeds", "1", TRITON_INTERPRET="1")
    table = pd.read_csv(out)
    assert table[(table["what"] == "acceptance")]["value"].iloc[0] == 1.0
    record = json.loads(out.with_suffix(".device.json").read_text())
    assert record["args"]["switches"] == "on"
    assert record["engine"]["target_switches"] == {"fused_rope_kv_write": True, "small_batch": True}
    assert record["engine"]["draft_small_linear"]
    assert record["engine"]["draft_round_graphs"] == 0  # a CPU captures none: its rounds go step by step


def test_the_defaults_on_a_cpu_leave_both_switches_off(tmp_path):
    """The bench measures the engine's defaults unless told otherwise: "auto" resolves off on a CPU (no CUDA), so the
    draft keeps its own blocks there, as the engine mode's draft does."""
    out = tmp_path / "spec_engine.csv"
    bench(out, "--new", "4", "--gamma", "2", "--prompt", "16", "--batch", "1", "--alpha", "1.0", "--seeds", "1")
    record = json.loads(out.with_suffix(".device.json").read_text())
    assert record["args"]["switches"] == "default"
    assert record["engine"]["target_switches"] == {"fused_rope_kv_write": False, "small_batch": False}
    assert not record["engine"]["draft_small_linear"]
