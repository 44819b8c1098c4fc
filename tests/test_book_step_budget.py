"""The engine page's step budget: one sentence and the command where it has not been measured; a deterministic
SVG figure and a table, computed from a synthetic ``step_budget.csv``, where it has."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from servelab.bench.kernel_classes import CLASSES
from servelab_book.engine_step_budget import (
    COMMAND,
    FIGURE,
    INCLUDE,
    SIDECAR,
    find_step_budget,
    step_budget_page,
    step_label,
)
from servelab_book.engine_step_budget_figure import floor_parts, measured_parts
from servelab_book.prepare import prepare

STEPS = {  # step -> (shape columns, step-level times in ms)
    "decode_b1_ctx128": (
        dict(kind="decode", batch=1, new_tokens=1, context=128, decodes=0, decode_context=0),
        dict(step_ms=0.97, profiled_wall_ms=1.1, idle_gap_ms=0.5, graph_idle_ms=0.3, host_ms=0.2),
    ),
    "mixed_d63_ctx512_chunk512": (
        dict(kind="mixed", batch=1, new_tokens=512, context=0, decodes=63, decode_context=512),
        dict(step_ms=2.1, profiled_wall_ms=2.3, idle_gap_ms=0.4, graph_idle_ms=0.25, host_ms=0.3),
    ),
    "prefill_b1_4096": (
        dict(kind="prefill", batch=1, new_tokens=4096, context=0, decodes=0, decode_context=0),
        dict(step_ms=2.9, profiled_wall_ms=3.1, idle_gap_ms=0.2, graph_idle_ms=float("nan"), host_ms=0.1),
    ),
}
BUSY = dict(gemm=0.2, attention=0.1, norm_elementwise=0.08, sampling=0.01, copies=0.005, other=0.005)  # decode, ms


def budget_rows(failed: str | None = None) -> list[dict]:
    rows = []
    for i, (step, (shape, times)) in enumerate(STEPS.items()):
        scale = 1 + 3 * i  # the longer steps: every class's time scaled
        floors = {c: 0.0 if c == "other" else BUSY[c] * scale / 4 for c in CLASSES}
        for cls in CLASSES:
            row = dict(step=step, **shape, **{"class": cls}, status="ok")
            if step == failed:
                rows.append(row | {"status": "error: RuntimeError: out of memory"})
                continue
            rows.append(
                row
                | times
                | dict(kernels=10 * (1 + CLASSES.index(cls)), busy_ms=BUSY[cls] * scale, floor_ms=floors[cls])
                | dict(step_floor_ms=sum(floors.values()))
            )
    return rows


def write_budget(root, rows, sidecar=True):
    d = root / "nvidia-h200" / "engine"
    d.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(d / "step_budget.csv", index=False)
    if sidecar:
        side = {
            "git_commit": "0123456789abcdef",
            "written_utc": "2027-01-02T03:04:05+00:00",
            "device": {"name": "NVIDIA H200"},
            "params": {"model": "config:qwen2-0.5b", "dtype": "bfloat16"},
        }
        (d / SIDECAR).write_text(json.dumps(side))
    return d / "step_budget.csv"


def test_without_a_measurement_the_page_says_so_and_gives_the_command(tmp_path):
    assert find_step_budget(tmp_path) is None
    page = step_budget_page(find_step_budget(tmp_path))
    assert page.svg is None
    assert page.markdown == (
        f"The step budget has not been measured on the H200 yet: `{COMMAND}` on the H200 measures it "
        "(`make gpu-plan` lists it as `engine:step_budget:0`).\n"
    )
    assert not re.search(r"\d+\.\d+ ?ms", page.markdown)  # no typed numbers


def test_a_measured_budget_gives_a_figure_and_a_table(tmp_path):
    csv = write_budget(tmp_path, budget_rows())
    assert find_step_budget(tmp_path) == csv
    page = step_budget_page(csv)
    md = page.markdown
    assert md.startswith(
        "From `nvidia-h200/engine/step_budget.csv`, run at commit `0123456789ab` on 2027-01-02T03:04:05+00:00 "
        "(config:qwen2-0.5b, bfloat16):"
    )
    assert f"```{{figure}} _generated/{FIGURE}" in md
    for label in ("decode, batch 1, context 128", "mixed: 63 decodes at context 512 + a 512-token chunk"):
        assert label in md
    assert "prefill of 4,096 tokens" in md
    # the caption's busy share: (0.2 + 0.1 + 0.08 + 0.01 + 0.005 + 0.005) / 1.1 for the decode step
    assert "decode, batch 1, context 128: 36%" in md and "prefill of 4,096 tokens: 90%" in md
    # the table: one column per step kind, the classes' busy / floor, the gaps, the host, the floors' sum
    assert "  - 0.2 / 0.05\n" in md and "  - 0.8 / 0.2\n" in md  # GEMM at the decode and the mixed step
    assert "* - GPU idle inside the graph (ms)\n  - 0.3\n  - 0.25\n  - —\n" in md
    assert "* - host, no kernel running (ms)\n  - 0.2\n  - 0.3\n  - 0.1\n" in md
    assert "* - kernels per step\n  - 210\n" in md
    svg = page.svg
    assert svg.startswith("<?xml") and "<svg" in svg
    assert "Where one engine step" in svg and "NVIDIA H200" in svg and "prefill of 4,096 tokens" in svg
    assert step_budget_page(csv).svg == svg  # the same bytes from the same data
    assert not re.search(r"\d{4}-\d{2}-\d{2}", svg)  # no date in it


def test_the_busiest_kernels_of_each_step_kind_follow_the_table_where_the_run_wrote_them(tmp_path):
    csv = write_budget(tmp_path, budget_rows())
    assert "busiest kernels" not in step_budget_page(csv).markdown  # a run from before step_kernels.csv
    kernels = [
        ("decode_b1_ctx128", "gemm", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN", 97, 0.3),
        ("decode_b1_ctx128", "attention", "_paged_decode_kernel", 24, 0.1),
        ("decode_b1_ctx128", "norm_elementwise", "void at::native::elementwise_kernel<128, 2, Fn>(int, Fn)", 2, 0.05),
        ("decode_b1_ctx128", "copies", "Memcpy DtoH (Device -> Pinned)", 1, 0.05),
        ("prefill_b1_4096", "attention", "_long_tile_kernel", 24, 2.0),
        ("dropped_step", "gemm", "not_on_the_page", 1, 9.0),  # a step kind the budget does not hold
    ]
    rows = [
        {"step": st, "kind": "x", "rank": 0, "class": c, "kernel": k, "launches": n, "busy_ms": ms}
        for st, c, k, n, ms in kernels
    ]
    pd.DataFrame(rows).to_csv(csv.parent / "step_kernels.csv", index=False)
    md = step_budget_page(csv).markdown
    table = md[md.index("The 3 busiest kernels") :]
    # the decode's three busiest of four, in order, with their share of its 0.5 ms of kernel time
    assert (
        "* - decode, batch 1, context 128\n  - `nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN`\n  - GEMM\n"
        "  - 97\n  - 300.0\n  - 60%" in table
    )
    assert "  - `_paged_decode_kernel`\n  - attention\n  - 24\n  - 100.0\n  - 20%" in table
    assert "  - `at::native::elementwise_kernel`\n  - norm \\& elementwise\n" in table  # no C++ around it
    assert "Memcpy" not in table and "not_on_the_page" not in table
    assert "* - prefill of 4,096 tokens\n  - `_long_tile_kernel`\n  - attention\n  - 24\n  - 2000.0\n  - 100%" in table


def test_the_bars_add_up_to_the_profiled_call_and_to_the_floors(tmp_path):
    t = pd.DataFrame(budget_rows())
    decode = t[t.step == "decode_b1_ctx128"]
    parts = measured_parts(decode)
    assert list(parts) == [*CLASSES, "graph_idle", "other_idle", "host"]
    assert parts["graph_idle"] == 0.3 and parts["other_idle"] == pytest.approx(0.2) and parts["host"] == 0.2
    assert sum(parts.values()) == pytest.approx(1.1)  # the profiled call
    prefill = measured_parts(t[t.step == "prefill_b1_4096"])
    assert prefill["graph_idle"] == 0 and prefill["other_idle"] == 0.2  # no graph: every gap is outside one
    assert sum(floor_parts(decode).values()) == pytest.approx(decode.step_floor_ms.iloc[0])


def test_a_step_kind_that_was_not_measured_is_named_and_left_out(tmp_path):
    csv = write_budget(tmp_path, budget_rows(failed="prefill_b1_4096"), sidecar=False)
    page = step_budget_page(csv)
    assert page.markdown.startswith("From `nvidia-h200/engine/step_budget.csv`:")
    assert "Not measured: prefill\\_b1\\_4096 (error: RuntimeError: out of memory)." in page.markdown
    assert "prefill of" not in page.markdown and "prefill of" not in page.svg
    nothing = [r | {"status": "skipped: time budget"} for r in budget_rows(failed="prefill_b1_4096")]
    none = step_budget_page(write_budget(tmp_path, [{k: r[k] for k in list(r)[:9]} for r in nothing]))
    assert none.svg is None and "no step kind was measured" in none.markdown


def test_a_malformed_budget_is_refused(tmp_path):
    csv = write_budget(tmp_path, [{k: v for k, v in r.items() if k != "busy_ms"} for r in budget_rows()])
    with pytest.raises(ValueError, match=r"missing columns \['busy_ms'\]"):
        step_budget_page(csv)


def test_step_labels():
    rows = pd.DataFrame([dict(kind="prefill", batch=4, new_tokens=256, context=1024, decodes=0, decode_context=0)])
    assert step_label(next(rows.itertuples())) == "prefill of 256 tokens × 4 after 1,024 cached"


def test_prepare_writes_the_include_and_the_figure_only_when_measured(tmp_path, monkeypatch):
    monkeypatch.setattr("servelab_book.prepare.all_evidence", lambda root, device: {})
    gen = tmp_path / "gen"
    prepare(tmp_path / "results", generated_dir=gen, mathjax_target=None, root=None)
    assert "has not been measured on the H200 yet" in (gen / INCLUDE).read_text() and not (gen / FIGURE).exists()
    write_budget(tmp_path / "results", budget_rows())
    prepare(tmp_path / "results", generated_dir=gen, mathjax_target=None, root=None)
    assert "```{figure} _generated/engine_step_budget.svg" in (gen / INCLUDE).read_text()
    assert (gen / FIGURE).read_text().startswith("<?xml")
    (tmp_path / "results" / "nvidia-h200" / "engine" / "step_budget.csv").unlink()
    prepare(tmp_path / "results", generated_dir=gen, mathjax_target=None, root=None)
    assert not (gen / FIGURE).exists()  # no figure of a budget that is no longer there
