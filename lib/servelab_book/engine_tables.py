"""The engine page's comparison tables, from the engine benchmark's ``decode.csv`` and ``exactness.csv``.

- decode: every implementation the benchmark timed (the engine's variants, HF eager, HF in a CUDA graph)
  at each (batch, context) point, in ms and in % of the memory floor measured in the same run;
- exactness: per model and engine variant, how many greedy steps agree with HF before the paths part,
  the largest logit error of the prefill, and the teacher-forced argmax agreement (bf16 on the H200).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from servelab.paths import REPO_ROOT
from servelab.studies.common.markdown import list_table, md_text
from servelab_book.engine_bench import bench_provenance
from servelab_book.engine_freshness import freshness

ENGINE_CODE = ("lib/servelab/engine", "lib/servelab/models", "lib/servelab/kernels", "lib/servelab/kv")


def frame_table(df: pd.DataFrame, css: str) -> str:
    """A DataFrame of formatted values as the book's list-table (empty and missing cells shown as —)."""
    return list_table(
        [md_text(c) for c in df.columns],
        [[(md_text(v) if pd.notna(v) else "") or "—" for v in r] for r in df.itertuples(index=False)],
        css=css,
    )


def render_decode_comparison(bench_csv: Path | None) -> str:
    """Decode step time per implementation and point: 'median ms (% of floor)'."""
    path = None if bench_csv is None else bench_csv.parent / "decode.csv"
    if path is None or not path.exists():
        return "No decode comparison has been measured on the H200 yet.\n"
    d = pd.read_csv(path)
    d = d[d["status"] == "ok"]
    d["point"] = [f"batch {b}, context {c:,}" for b, c in zip(d["batch"], d["context"], strict=True)]
    d["cell"] = d.apply(lambda r: f"{r.median_ms:.2f} ms ({r.pct_of_floor:.1f}%)", axis=1)
    # the benchmark times some variants at some points only (the fused RoPE kernel not at 16K)
    table = d.pivot(index="impl", columns="point", values="cell").fillna("not timed").reset_index()
    floors = d.groupby("point")["floor_ms"].first()
    floor_row = {"impl": "memory floor (weights + KV at the measured copy ceiling)"}
    floor_row.update({p: f"{v:.3f} ms" for p, v in floors.items()})
    table = pd.concat([table, pd.DataFrame([floor_row])], ignore_index=True).rename(columns={"impl": "implementation"})
    return frame_table(table, "servelab-engine-decode")


def render_exactness(bench_csv: Path | None) -> str:
    """Greedy agreement with HF on the same weights, per model and engine variant."""
    path = None if bench_csv is None else bench_csv.parent / "exactness.csv"
    if path is None or not path.exists():
        return "The engine's agreement with HF has not been measured on the H200 yet.\n"
    d = pd.read_csv(path)
    g = (
        d.groupby(["model", "dtype", "engine"], sort=False)
        .agg(
            prompts=("prompt", "count"),
            steps=("steps", "first"),
            agree_min=("tokens_agree", "min"),
            agree_median=("tokens_agree", "median"),
            logit_err=("logit_max_abs_err", "max"),
            gap=("ref_top1_top2_gap", "median"),
            tf=("tf_argmax_agree_frac", "mean"),
        )
        .reset_index()
    )
    table = pd.DataFrame(
        {
            "model": g["model"],
            "dtype": g["dtype"],
            "engine": g["engine"],
            "greedy steps agreeing (min / median of prompts)": g.apply(
                lambda r: f"{r.agree_min:.0f} / {r.agree_median:.0f} of {r.steps:.0f}", axis=1
            ),
            "max prefill logit error": g["logit_err"].map(lambda v: f"{v:.3g}"),
            "HF top-1 − top-2 logit gap (median)": g["gap"].map(lambda v: f"{v:.3g}"),
            "teacher-forced argmax agreement": g["tf"].map(lambda v: f"{v:.3f}"),
        }
    )
    return frame_table(table, "servelab-engine-exactness")


def engine_code_changed_since(commit: str, repo: Path = REPO_ROOT) -> bool | None:
    """Whether the engine's code (engine, models, kernels, KV) differs between ``commit`` and the working tree;
    None when git cannot tell (no repository, or the commit is not in this clone's history)."""
    try:
        r = subprocess.run(
            ["git", "diff", "--quiet", commit, "--", *ENGINE_CODE], cwd=repo, capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: False, 1: True}.get(r.returncode)


def render_code_status(bench_csv: Path | None) -> str:
    """One sentence: is the benchmarked engine the engine in this checkout? By the benchmark's fingerprint where
    its run recorded one (as the studies' pages judge theirs), else by git over the engine's folders."""
    prov = bench_provenance(bench_csv)
    if prov is None:
        return ""
    if prov.fingerprint:
        return freshness("bench", {"git_commit": prov.commit, "fingerprint": prov.fingerprint,
                                   "fingerprint_files": prov.fingerprint_files}, "The benchmark")  # fmt: skip
    commit = prov.commit
    changed = engine_code_changed_since(commit) if commit else None
    if changed is None:
        return (
            f"Whether the engine's code has changed since commit `{md_text(commit) or 'unknown'}` could not be "
            "checked in this build (no git history).\n"
        )
    if changed:
        return (
            f"The engine's code (`engine/`, `models/`, `kernels/`, `kv/`) has changed since commit "
            f"`{md_text(commit)}`, where the benchmark ran: the tables describe that commit's engine until the "
            "benchmark runs again (`make gpu-plan` lists it as `engine:bench:0`).\n"
        )
    return f"The engine's code is unchanged since commit `{md_text(commit)}`, where the benchmark ran.\n"
