"""The controlled-acceptance page (``servelab_book.controlled``): its numbers are those of Study 3's report over the
H200's runs (``report.controlled``, ``.controlled_pays``, the raw rows), computed here independently of the module; the
goal sentence follows the data; a missing run, an unconverted Study 3 or a failing report is a sentence, not an
error."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from servelab.paths import REPO_ROOT
from servelab.speculative import leviathan
from servelab.studies.common.runs import study_runs
from servelab_book import controlled as page
from servelab_book.controlled_figure import figure_svg

RESULTS = REPO_ROOT / "data" / "results"
H200 = RESULTS / "nvidia-h200"
BENCH = H200 / "engine" / "bench.csv"
GAMMAS = [1, 2, 3, 4, 6, 8]


@pytest.fixture(scope="module")
def run() -> page.ControlledRun:
    """The H200's sweep through Study 3's report; skipped (with why) until Study 3's reporting path gives it."""
    found = page.find_controlled(RESULTS, "h200")
    if isinstance(found, str):
        pytest.skip(f"no controlled sweep from Study 3's report: {found}")
    return found


@pytest.fixture(scope="module")
def files(run) -> page.PageFiles:
    return page.controlled_page(RESULTS, "h200")


@pytest.fixture(scope="module")
def table(run) -> pd.DataFrame:
    return run.table


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


# --- the page's numbers against the report's---------------------------------------------------------------------


def test_goal_numbers_and_verdict_follow_the_csv(files, table):
    s = table[(table.target == "llama-3-8b") & (table.batch == 1) & np.isclose(table.alpha, 0.8)]
    text = files.markdown["controlled_goal.md"]
    if s.empty:  # the campaign has not reached the 8B pair: the page says so and claims nothing
        assert "did not run" in text and "**met**" not in text and "**missed" not in text
        return
    best = s.loc[s.speedup.idxmax()]
    met = best.speedup >= 2.0 and abs(best.predicted_speedup - best.speedup) / best.predicted_speedup <= 0.15
    assert f"best γ = {int(best.gamma)}: **{best.speedup:.2f}×**" in text
    assert f"(its timed rounds {best.speedup_low:.2f}–{best.speedup_high:.2f}×)" in text
    assert f"**{best.predicted_speedup:.2f}×** predicted" in text
    assert f"c = {best.c:.3f}" in text
    assert ("**met**" in text) == met
    assert ("**missed" in text) == (not met)
    if best.speedup < 2.0:
        assert f"{2.0 - best.speedup:.2f}× short of 2×" in text


def test_goal_c_needed_is_solved_from_the_formula(files):
    # at α = 0.8: E[tokens] = (1 − 0.8^(γ+1)) / 0.2; c = (E / 2 − 1) / γ is largest at γ = 4: (3.3616 / 2 − 1) / 4
    gamma, c = page.c_needed(0.8, 2.0, GAMMAS)
    assert gamma == 4
    assert c == pytest.approx((1 - 0.8**5) / 0.2 / 2 / 4 - 1 / 4)
    assert leviathan.improvement(0.8, gamma, c) == pytest.approx(2.0)
    assert all(leviathan.improvement(0.8, g, c) <= 2.0 + 1e-12 for g in GAMMAS)
    text = files.markdown["controlled_goal.md"]
    assert f"c ≤ {c:.3f} (at γ = 4" in text or "did not run" in text  # the sentence where the goal's point ran


def test_cost_rows_are_the_plain_step_and_c_times_it(files, table, run):
    from servelab.studies.common.runs import study_runs

    # each campaign repeat's raw rows apart (the raw table's own "repeat" column counts repeats within one run)
    runs = [rep.table("controlled_raw") for rep in study_runs("03_speculative", RESULTS).per_repeat()]
    plains = [r[(r.method == "plain") & (r.status == "ok")] for r in runs if len(r)]
    engine_ms = float(pd.read_csv(BENCH).set_index("metric").loc["decode_ms_b1_ctx128", "value"])
    text = files.markdown["controlled_cost.md"]
    for (t, b), grp in table.groupby(["target", "batch"]):
        step_ms = 1e3 * b / grp.tokens_per_s_plain.median()
        # one step of the batch: each repeat's median step, as a rate, then the median over the repeats
        per_repeat = [np.median(1e3 * p.seconds / p.steps) for p in
                      (q[(q.target == t) & (q.batch == b)] for q in plains) if len(p)]  # fmt: skip
        # the table holds the median over the repeats of each repeat's rate, so the step is the step at that rate:
        # with an even count of repeats it is not the median step (the middle two's harmonic mean, not their mean)
        assert 1e3 * b / step_ms == pytest.approx(np.median([1e3 * b / s for s in per_repeat]), rel=1e-6)
        c = grp.c.median()
        row = f"  - {b}\n  - {step_ms:.2f}\n  - {c:.3f} ({grp.c.min():.3f}–{grp.c.max():.3f})\n  - {c * step_ms:.2f}\n"
        assert row in text, row
        if b == 1:  # the engine's decode stands beside a draft of the shape it timed (qwen2-0.5b) only
            for d in grp.draft.unique():
                cd = grp[grp.draft == d].c.median()
                same = d.split("-vocab")[0] == "qwen2-0.5b"
                engine = f"  - {engine_ms:.3f}\n  - {cd * step_ms / engine_ms:.1f}×" if same else "  - —\n  - —"
                assert f"  - {cd * step_ms:.2f}\n{engine}" in text, (d, engine)
    bench_commit = json.loads((BENCH.parent / "run.json").read_text())["git_commit"][:7]
    assert f"`{bench_commit}`" in text and all(f"`{c}`" in text for c in run.commits)  # from the run.json files


def test_break_even_alpha_per_pair_and_batch(files, table, run):
    text = files.markdown["controlled_pays.md"]
    for r in run.pays.itertuples():
        c = table[(table.target == r.target) & (table.batch == r.batch)].c.median()
        predicted = min(leviathan.break_even_alpha(c, g) for g in GAMMAS)
        if math.isnan(r.alpha_pays):
            cell = f"never (best {r.best_speedup:.2f}×"
        elif bool(r.all_pay):
            cell = f"≤ {r.alpha_pays:g} (pays at every α measured"
        else:
            cell = f"{r.alpha_pays:.2f} (best {r.best_speedup:.2f}×)"
        assert f"  - {r.batch}\n  - {cell}" in text
        assert f"  - {predicted:.2f}\n  - {c:.3f}\n  - {1 / c:.2f}×" in text
    # the seed's c = 1/1.18: γ = 1 breaks even first, at α = c (1 + α = 1 + c)
    assert "c = 0.847); at that c Leviathan's formula puts the break-even at α = 0.85." in text


def test_setup_names_the_runs_and_what_is_not_measured_yet(files, table, run):
    text = files.markdown["controlled_setup.md"]
    assert f": {len(table)} points, each run in a time budget of {run.params['controlled_budget_s']} s" in text
    assert all(f"`{c}`" in text for c in run.commits) and "NVIDIA H200" in text
    for part, metas in run.parts.items():
        assert f"{part} ({len(metas)} repeat" in text
    for _draft, t_spec in run.params["controlled_pairs"]:
        target = t_spec.removeprefix("config:")
        measured = (table.target == target).any()
        waits = [run.part_of(target, b) for b in run.params["batches"]]
        if any(p not in run.parts for p in waits):
            assert f"→ {target} at batch" in text.split("Not measured yet")[1]
        else:
            assert measured or f"→ {target}: not reached" in text
    assert "`llama-3-8b`'s vocabulary in place of its own 151,936" in text  # the 8B pair's draft, said


def test_c_and_the_error_are_one_statistic_on_both_pages(files, table, run):
    # the audit: Study 3's table of where each pair pays read c = 0.610 (its best-γ rows' median) where this page read
    # 0.593 (every point's) for the same runs, and F3.3 quoted 1/c from the one while pointing at the other; F3.2's
    # note gave one repeat's |error| over 240 points beside this figure's signed error over 270
    from servelab.studies.s03_speculative.report import pays_view

    shown = pays_view(run.pays).set_index(["draft", "target", "batch"])["c in the loop (median, every γ and α)"]
    for r in run.pays.itertuples():
        c = table[(table.target == r.target) & (table.draft == r.draft) & (table.batch == r.batch)].c.median()
        assert r.c == pytest.approx(c) and shown.loc[(r.draft, r.target, r.batch)] == pytest.approx(round(c, 3))
        assert f"  - {c:.3f}\n  - {1 / c:.2f}×" in files.markdown["controlled_pays.md"]
    err = table.prediction_error_pct.abs()
    b1 = err[table.batch == 1].median()
    caption = files.markdown["controlled_figure.md"]
    assert f"the median is {err.median():.0f}% over all {len(table)} and {b1:.0f}% at batch 1" in caption
    report3 = page.study3_report(RESULTS, "h200")
    notes = {f.id: f.note for f in report3.findings}
    assert f"the median |error| is {err.median():.0f}% over {len(table)} points (batch 1: {b1:.0f}%)" in notes["F3.2"]
    q = table[(table.draft == "qwen2-0.5b") & (table.target == "qwen2-1.5b") & (table.batch == 1)].c.median()
    assert f"ratio at batch 1, {1 / q:.3f}× (1/c, with c = {q:.3f} in Study 3's table" in notes["F3.3"]


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
    assert set(out.markdown) == {f"controlled_{n}.md" for n in ("setup", "goal", "cost", "pays", "figure", "rerun")}
    assert set(out.markdown) == set(page.INCLUDES)
    assert all("Not measured: " in t and "has not run" in t and "{figure}" not in t for t in measured(out))
    assert "scripts/gpu_run.sh 03_speculative:controlled_qwen2:0" in out.markdown["controlled_rerun.md"]


def measured(out: page.PageFiles) -> list[str]:
    """The includes that show measurements (the re-run recipe stands whether or not the sweep ran)."""
    return [t for name, t in out.markdown.items() if name != "controlled_rerun.md"]


def test_an_unconverted_or_failing_study_3_report_is_a_sentence(tmp_path, monkeypatch):
    import servelab_book.findings as findings

    monkeypatch.setattr(findings, "converted", lambda slug: False)
    out = page.controlled_page(tmp_path, "h200")
    assert out.svg is None and all(findings.NOT_CONVERTED.split()[0] in t for t in measured(out))

    def boom(runs):
        raise KeyError("controlled_raw")

    monkeypatch.setattr(findings, "converted", lambda slug: True)
    monkeypatch.setattr(page.report, "report", boom, raising=False)
    out = page.controlled_page(tmp_path, "h200")
    assert out.svg is None and all("its report failed: KeyError" in t for t in measured(out))


def test_the_page_is_built_from_study_3s_report(tmp_path, monkeypatch):
    """Through the report's API (``.controlled``, ``.controlled_pays``, ``.shapes_tested_on``, the controlled part's
    ``run.json``): a made-up sweep whose goal point meets the goal gives "met", its pays row and a figure."""
    folder = tmp_path / "nvidia-h200" / "03_speculative" / "runs" / "legacy" / "controlled" / "r0"
    folder.mkdir(parents=True)
    params = dict(controlled_pairs=[["config:qwen2-0.5b-vocab128k", "config:llama-3-8b"]], alphas=[0.5, 0.6, 0.7])
    params |= dict(controlled_gammas=[1, 2], batches=[1], controlled_budget_s=320)
    meta = dict(complete=True, fingerprint="legacy", part="controlled", git_commit="abc1234", params=params)
    (folder / "run.json").write_text(json.dumps(meta | {"device": {"name": "NVIDIA H200"}, "wall_s": 300}))
    pays = pd.DataFrame(
        [
            dict(target="llama-3-8b", draft="qwen2-0.5b-vocab128k", batch=1, alpha_pays=0.55, all_pay=0.0)
            | dict(best_speedup=2.1, alpha_max=0.9, c=0.2)
        ]
    )
    fake = SimpleNamespace(
        runs=study_runs("03_speculative", tmp_path, device="h200"),
        controlled=synthetic(2.1, 2.2),
        controlled_pays=pays,
        shapes_tested_on="qwen2-0.5b (random weights)",
    )
    monkeypatch.setattr(page, "study3_report", lambda root, device: fake)
    out = page.controlled_page(tmp_path, "h200")
    assert "**met**" in out.markdown["controlled_goal.md"]
    assert "  - 1\n  - 0.55 (best 2.10×)" in out.markdown["controlled_pays.md"]
    setup = out.markdown["controlled_setup.md"]
    assert "commit `abc1234`" in setup and "Tested on: qwen2-0.5b (random weights)." in setup
    assert ": 10 points, each run in a time budget of 320 s" in setup
    assert out.svg is not None and out.svg.startswith("<?xml")


def test_figure_is_svg_and_the_same_bytes_twice():
    t = synthetic(1.5, 1.6)
    a, b = figure_svg(t, "test device"), figure_svg(t, "test device")
    assert a.startswith("<?xml") and "<svg" in a
    assert a == b
    assert "γ = 2" in a and "batch 1" in a  # text stays text (svg.fonttype none)


def test_page_includes_every_generated_file_and_sits_after_study_3():
    text = (REPO_ROOT / "book" / "speculative_controlled.md").read_text()
    for n in page.INCLUDES:
        assert f"```{{include}} _generated/{n}" in text
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert files[files.index("book/studies/03_speculative") + 1] == "book/speculative_controlled"


def test_the_engine_column_stands_beside_drafts_of_the_shape_it_timed():
    # 2026-12-07 audit: distilgpt2's draft step was set against qwen2-0.5b's engine decode ("0.3×")
    engine = page.EngineDecode(0.96, "config:qwen2-0.5b", "abc")
    assert page.engine_timed("qwen2-0.5b", engine) and page.engine_timed("qwen2-0.5b-vocab128k", engine)
    assert not page.engine_timed("distilgpt2", engine) and not page.engine_timed("qwen2-0.5b", None)
    table = pd.concat([synthetic(1.9, 1.8).assign(draft=d) for d in ("qwen2-0.5b-vocab128k", "distilgpt2")])
    cost = page.cost_table(table.assign(target=table.draft + "-target"), engine)
    assert cost.set_index("draft").engine_ms.isna().to_dict() == {"qwen2-0.5b-vocab128k": False, "distilgpt2": True}


def test_setup_and_goal_say_what_each_point_rests_on(files, run):
    setup, goal = files.markdown["controlled_setup.md"], files.markdown["controlled_goal.md"]
    assert f"Each run times every point {run.params['controlled_repeats']} times" in setup
    for r in run.pays.drop_duplicates(["draft", "target"]).itertuples():
        n = run.pays[(run.pays.draft == r.draft) & (run.pays.target == r.target)].n_repeats
        said = str(int(n.min())) if n.min() == n.max() else f"{int(n.min())}–{int(n.max())}"
        assert f"{r.draft} → {r.target}: {said}" in setup
    at_goal = run.pays[(run.pays.target == "llama-3-8b") & (run.pays.batch == 1)].n_repeats
    if len(at_goal) and int(at_goal.iloc[0]) < run.total_repeats:
        assert f"measured in {int(at_goal.iloc[0])} of the {run.total_repeats} repeats" in goal
