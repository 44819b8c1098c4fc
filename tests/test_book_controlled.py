"""The controlled-acceptance page (``servelab_book.controlled``): its numbers are those of the H200's CSV, computed
here independently of the module; the goal sentence follows the data; a missing run is a sentence, not an error."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from servelab.paths import REPO_ROOT
from servelab.spec import leviathan
from servelab.studies.s03_speculative import controlled
from servelab_book import controlled as page
from servelab_book.controlled_figure import figure_svg

RESULTS = REPO_ROOT / "data" / "results"
H200 = RESULTS / "nvidia-h200"
CSV = H200 / "03_speculative" / "controlled_acceptance.csv"
RAW = H200 / "03_speculative_controlled" / "controlled_raw.csv"
BENCH = H200 / "engine" / "bench.csv"
GAMMAS = [1, 2, 3, 4, 6, 8]

needs_run = pytest.mark.skipif(not CSV.exists(), reason="the H200's controlled-acceptance run is not in the tree")


@pytest.fixture(scope="module")
def files() -> page.PageFiles:
    return page.controlled_page(RESULTS, "h200")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(CSV)


def synthetic(speedup: float, predicted: float, c: float = 0.2) -> pd.DataFrame:
    """A one-pair table: the 8B-shape target at batch 1, α 0.5–0.9, γ 1–2; the goal's point has ``speedup`` and
    ``predicted`` at γ = 2, every other point less."""
    rows = []
    for g in (1, 2):
        for a in (0.5, 0.6, 0.7, 0.8, 0.9):
            sp, pr = (speedup, predicted) if (g, a) == (2, 0.8) else (0.5 + a / 2, 0.6 + a / 2)
            rows.append(
                dict(target="llama-3-8b", draft="qwen2-0.5b-vocab128k", alpha=a, gamma=g, batch=1)
                | dict(tokens_per_s_plain=100.0, tokens_per_s_spec=100 * sp, speedup=sp, predicted_speedup=pr, c=c)
                | dict(speedup_low=0.95 * sp, speedup_high=1.05 * sp, c_low=c, c_high=c, repeats=3)
                | dict(prediction_error_pct=100 * (pr - sp) / sp, verify_over_step=1.0, loop_overhead_pct=3.0)
            )
    return pd.DataFrame(rows)


# --- the page's numbers against the CSV ----------------------------------------------------------------------


@needs_run
def test_goal_numbers_and_verdict_follow_the_csv(files, table):
    s = table[(table.target == "llama-3-8b") & (table.batch == 1) & np.isclose(table.alpha, 0.8)]
    best = s.loc[s.speedup.idxmax()]
    met = best.speedup >= 2.0 and abs(best.predicted_speedup - best.speedup) / best.predicted_speedup <= 0.15
    text = files.markdown["controlled_goal.md"]
    assert f"best γ = {int(best.gamma)}: **{best.speedup:.2f}×**" in text
    assert f"(repeats {best.speedup_low:.2f}–{best.speedup_high:.2f}×)" in text
    assert f"**{best.predicted_speedup:.2f}×** predicted" in text
    assert f"c = {best.c:.3f}" in text
    assert ("**met**" in text) == met
    assert ("**missed" in text) == (not met)
    if best.speedup < 2.0:
        assert f"{2.0 - best.speedup:.2f}× short of 2×" in text


@needs_run
def test_goal_c_needed_is_solved_from_the_formula(files):
    # at α = 0.8: E[tokens] = (1 − 0.8^(γ+1)) / 0.2; c = (E / 2 − 1) / γ is largest at γ = 4: (3.3616 / 2 − 1) / 4
    gamma, c = page.c_needed(0.8, 2.0, GAMMAS)
    assert gamma == 4
    assert c == pytest.approx((1 - 0.8**5) / 0.2 / 2 / 4 - 1 / 4)
    assert leviathan.improvement(0.8, gamma, c) == pytest.approx(2.0)
    assert all(leviathan.improvement(0.8, g, c) <= 2.0 + 1e-12 for g in GAMMAS)
    assert f"c ≤ {c:.3f} (at γ = 4" in files.markdown["controlled_goal.md"]


@needs_run
def test_cost_rows_are_the_plain_step_and_c_times_it(files, table):
    raw = pd.read_csv(RAW)
    plain = raw[(raw.method == "plain") & (raw.status == "ok")]
    engine_ms = float(pd.read_csv(BENCH).set_index("metric").loc["decode_ms_b1_ctx128", "value"])
    text = files.markdown["controlled_cost.md"]
    for (t, b), grp in table.groupby(["target", "batch"]):
        step_ms = 1e3 * b / grp.tokens_per_s_plain.median()
        p = plain[(plain.target == t) & (plain.batch == b)]
        assert step_ms == pytest.approx(np.median(1e3 * p.seconds / p.steps), rel=1e-6)  # one step of the batch
        c = grp.c.median()
        row = f"  - {b}\n  - {step_ms:.2f}\n  - {c:.3f} ({grp.c.min():.3f}–{grp.c.max():.3f})\n  - {c * step_ms:.2f}\n"
        assert row in text, row
        if b == 1:
            assert f"  - {c * step_ms:.2f}\n  - {engine_ms:.3f}\n  - {c * step_ms / engine_ms:.1f}×" in text
    assert "`f60ac54`" in text and "`23785e5`" in text  # the bench's and the sweep's commits, from run.json


@needs_run
def test_break_even_alpha_per_pair_and_batch(files, table):
    text = files.markdown["controlled_pays.md"]
    for r in controlled.break_even_alpha(table).itertuples():
        c = table[(table.target == r.target) & (table.batch == r.batch)].c.median()
        predicted = min(leviathan.break_even_alpha(c, g) for g in GAMMAS)
        if math.isnan(r.alpha_pays):
            cell = f"never (best {r.best_speedup:.2f}×"
        elif r.all_pay:
            cell = f"≤ {r.alpha_pays:g} (pays at every α measured"
        else:
            cell = f"{r.alpha_pays:.2f} (best {r.best_speedup:.2f}×)"
        assert f"  - {r.batch}\n  - {cell}" in text
        assert f"  - {predicted:.2f}\n  - {c:.3f}\n  - {1 / c:.2f}×" in text
    # the seed's c = 1/1.18: γ = 1 breaks even first, at α = c (1 + α = 1 + c)
    assert "c = 0.847); at that c Leviathan's formula puts the break-even at α = 0.85." in text


@needs_run
def test_setup_names_the_run_and_what_the_budget_left_out(files, table):
    text = files.markdown["controlled_setup.md"]
    assert f": {len(table)} points in a time budget of 320 s" in text
    assert "commit `23785e5`" in text and "NVIDIA H200" in text
    n8 = int(((table.target == "llama-3-8b") & (table.batch == 8)).sum())
    assert f"llama-3-8b at batch 8: {n8} of 30 points" in text
    assert "llama-3-8b at batch 32: no point" in text
    assert "distilgpt2 → gpt2-medium: not reached" in text
    assert "`llama-3-8b`'s vocabulary in place of its own 151,936" in text  # the 8B pair's draft, said


# --- the goal sentence on made-up tables ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("speedup", "predicted", "verdict"),
    [
        (2.10, 2.20, "**met**"),
        (2.10, 2.60, "**missed: it is 19.2% from the prediction"),
        (1.50, 1.55, "**missed: the speedup is 0.50× short of 2× (75% of it)**"),
    ],
)
def test_goal_sentence_says_met_only_when_both_parts_hold(speedup, predicted, verdict):
    text = page.render_goal(synthetic(speedup, predicted), [1, 2])
    assert verdict in text
    assert text.count("**met**") == (verdict == "**met**")


def test_goal_point_missing_is_said():
    t = synthetic(2.1, 2.2)
    assert "did not run" in page.render_goal(t[t.alpha != 0.8], [1, 2])


# --- files, figure, book wiring ------------------------------------------------------------------------------


def test_no_run_gives_sentences_and_no_figure(tmp_path):
    out = page.controlled_page(tmp_path, "h200")
    assert out.svg is None
    assert set(out.markdown) == {f"controlled_{n}.md" for n in ("setup", "goal", "cost", "pays", "figure")}
    assert set(out.markdown) == set(page.INCLUDES)
    assert all("has not run" in t and "{figure}" not in t for t in out.markdown.values())


def test_figure_is_svg_and_the_same_bytes_twice():
    t = synthetic(1.5, 1.6)
    a, b = figure_svg(t, "test device"), figure_svg(t, "test device")
    assert a.startswith("<?xml") and "<svg" in a
    assert a == b
    assert "γ = 2" in a and "batch 1" in a  # text stays text (svg.fonttype none)


@needs_run
def test_run_found_through_the_device_glob(tmp_path):
    for rel in ("03_speculative/controlled_acceptance.csv", "03_speculative_controlled/run.json"):
        (tmp_path / "nvidia-h200" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(H200 / rel, tmp_path / "nvidia-h200" / rel)
    run = page.find_controlled(tmp_path, "h200")
    assert run is not None and run.raw is None and len(run.table) == len(pd.read_csv(CSV))
    assert page.find_engine_decode(tmp_path, "h200") is None  # no bench there: the cost table says so
    assert "has not run on the H200" in page.render_cost(run.table, None, run)


def test_page_includes_every_generated_file_and_sits_after_study_3():
    text = (REPO_ROOT / "book" / "speculative_controlled.md").read_text()
    for n in ("setup", "goal", "cost", "pays", "figure"):
        assert f"```{{include}} _generated/controlled_{n}.md" in text
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert files[files.index("book/studies/03_speculative") + 1] == "book/speculative_controlled"
