"""The engine page's sentences that carry numbers, computed from the engine benchmark's CSVs at build time.

The page's prose says what the engine does; every measured number it quotes comes from here, so that a new run of
the benchmark changes the text with the tables. Each ``render_*`` takes the ``bench.csv`` path (or None, when the
benchmark has not run on the book's device) and reads the files beside it (``decode.csv``, ``latency.csv``,
``offline.csv``, ``exactness.csv``). A row a run did not produce leaves its sentence out rather than guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab_book.engine_bench import metric_words

NOT_RUN = "The engine has not been benchmarked on the H200 yet.\n"


def bench_rows(bench_csv: Path | None) -> dict[str, pd.Series]:
    """bench.csv's rows by metric name (empty when there is no benchmark)."""
    if bench_csv is None or not bench_csv.exists():
        return {}
    df = pd.read_csv(bench_csv, keep_default_na=False, dtype=str)
    return {r["metric"]: r for _, r in df.iterrows()}


def code(text: str) -> str:
    """``text`` as an inline code span (Markdown escapes would show literally inside one)."""
    return "`" + str(text).replace("`", "'") + "`"


def num(row: pd.Series, col: str = "value") -> float | None:
    """A numeric cell of a bench row, None where it is empty."""
    text = str(row.get(col, "")).strip()
    return float(text) if text else None


@dataclass(frozen=True)
class Goal:
    """A row's goal, as the benchmark writes it: ``<= 0.6`` (an upper bound) or ``>= 60000`` (a lower bound)."""

    op: str  # "<=" or ">="
    target: float

    @classmethod
    def parse(cls, text: str) -> Goal | None:
        m = re.fullmatch(r"\s*(<=|>=)\s*([0-9.eE+-]+)\s*", text or "")
        return cls(m.group(1), float(m.group(2))) if m else None

    def met(self, value: float) -> bool:
        return value <= self.target if self.op == "<=" else value >= self.target

    def __str__(self) -> str:
        return f"{'≤' if self.op == '<=' else '≥'} {format_value(str(self.target))}"

    def outcome(self, value: float, unit: str) -> str:
        """'met', or by how much it is missed: the multiple of an upper bound, the fraction of a lower one."""
        if self.met(value):
            return "met"
        # a ratio's unit ("x") or a long one ("fraction of matmul ceiling") reads better left out of the gap
        gap = format_value(str(abs(value - self.target))) + (f" {unit}" if unit != "x" and len(unit) <= 8 else "")
        if self.op == "<=":
            return f"missed: {value / self.target:.2f}× the goal, {gap} over"
        return f"missed: {value / self.target:.2f} of the goal, {gap} short"


def profile_of(note: str) -> str:
    """What a row's note says about the timed step's profile: from ``profile:`` up to the other implementations."""
    m = re.search(r"profile: (.*?)(?:; others:|$)", note)
    if m:
        return m.group(1)
    m = re.search(r"per step \(median\): (.*)$", note)
    return f"per step (median): {m.group(1)}" if m else note


def render_goals(bench_csv: Path | None) -> str:
    """Every row that has a goal: its value, the goal, met or missed by how much, and what its profile shows."""
    rows = [r for r in bench_rows(bench_csv).values() if Goal.parse(r.get("goal", "")) and num(r) is not None]
    if not rows:
        return NOT_RUN
    body = []
    for r in rows:
        goal, value, unit = Goal.parse(r["goal"]), num(r), r["unit"]
        outcome = goal.outcome(value, unit)
        left = "" if outcome == "met" else profile_of(r.get("note", ""))
        cells = [f"{format_value(r['value'])} {'×' if unit == 'x' else unit}", str(goal), outcome, format_value(left)]
        body.append([metric_words(r["metric"])] + [md_text(c) for c in cells])
    head = ["What is measured", "Measured", "Goal", "Outcome", "What the row's profile shows is left"]
    return list_table(head, [[c or "—" for c in row] for row in body], css="servelab-engine-goals")


def render_failures(bench_csv: Path | None) -> str:
    """A sentence per row the run could not measure (no value, and a note that says it failed)."""
    failed = [r for r in bench_rows(bench_csv).values() if num(r) is None and "failed" in r.get("note", "")]
    lines = []
    for r in failed:
        reason = r["note"].split("failed:", 1)[-1].strip()
        setting = re.search(r"(\S+=\S+) failed", r["note"])
        what = f"the setting {code(setting.group(1))}" if setting else "its setting"
        lines.append(f"The row {code(r['metric'])} has no value: {what} failed in this run, with {code(reason)}.\n")
    return "\n".join(lines)


def _decode(bench_csv: Path) -> pd.DataFrame | None:
    path = bench_csv.parent / "decode.csv"
    return pd.read_csv(path) if path.exists() else None


def render_long_context(bench_csv: Path | None) -> str:
    """Decode at batch 1 with a long context beside a short one, and the one-pass gather path at the long one."""
    rows = bench_rows(bench_csv)
    # the bench's batch-1 decode rows name their context (decode_ms_b1_ctx<N>): the shortest and the longest
    contexts = sorted(int(m.group(1)) for k in rows if (m := re.fullmatch(r"decode_ms_b1_ctx(\d+)", k)))
    if len(contexts) < 2:
        return ""
    lo, hi = contexts[0], contexts[-1]
    short, long_ = rows[f"decode_ms_b1_ctx{lo}"], rows[f"decode_ms_b1_ctx{hi}"]
    if num(long_) is None or num(short) is None:
        return ""
    text = (
        f"At batch 1, a decode step over {hi:,} tokens of context takes {format_value(long_['value'])} ms, against "
        f"{format_value(short['value'])} ms over {lo:,} tokens: {num(long_) / num(short):.2f}× the time for "
        f"{hi / lo:,.0f}× the context; its memory floor, {format_value(long_['roofline_bound'])} ms, is "
        f"{format_value(long_['pct_of_roofline'])}% of that time."
    )
    d = _decode(bench_csv)
    if d is not None:
        at = d[(d["batch"] == 1) & (d["context"] == hi) & (d["status"] == "ok")].set_index("impl")
        if {"engine_default", "engine_gather_eager"} <= set(at.index):
            kernel = re.search(r"_paged_decode_kernel ×(\d+) (\d+) µs", str(at.loc["engine_default", "top_kernels"]))
            text += (
                f" Gathering the pages for SDPA instead takes {at.loc['engine_gather_eager', 'median_ms']:.2f} ms "
                "there."
            )
            if kernel:
                text += (
                    f" In the engine's step, the decode kernel's {kernel.group(1)} launches (one a layer) take "
                    f"{kernel.group(2)} µs of GPU time in all."
                )
    return text + "\n"


def render_offline(bench_csv: Path | None) -> str:
    """Offline throughput at the default token budget per step (``max_num_batched_tokens``) and at 512 tokens a step,
    and the ratio against its goal. "Step budget" is not used for it: the page gives that name to the breakdown of
    a step's time (``servelab.bench.step_budget``)."""
    rows = bench_rows(bench_csv)
    full, small, ratio = (rows.get(k) for k in ("offline_tok_s", "offline_tok_s_budget512", "offline_budget512_ratio"))
    if full is None or small is None or ratio is None:
        return ""
    text = (
        f"The offline workload runs at {format_value(full['value'])} tok/s with the default token budget per step "
        f"(`max_num_batched_tokens`) and at {format_value(small['value'])} tok/s when every step holds at most 512 "
        "tokens: "
        f"{num(ratio):.3f} of it"
    )
    goal = Goal.parse(ratio.get("goal", ""))
    text += f" (goal {goal}; {goal.outcome(num(ratio), 'x')})." if goal else "."
    path = bench_csv.parent / "offline.csv"
    if path.exists():
        o = pd.read_csv(path)
        o = o[o["impl"] == "engine"].set_index("setting")
        if {"default", "max_num_batched_tokens=512"} <= set(o.index):
            a, b = o.loc["default"], o.loc["max_num_batched_tokens=512"]
            text += (
                f" The small budget splits prompts into chunks: {b.step_graph_steps:,.0f} prefill or mixed steps "
                f"instead of {a.step_graph_steps:,.0f}, beside {b.graph_steps:,.0f} and {a.graph_steps:,.0f} decode "
                "steps, and each of those steps pays its own launch and host time."
            )
    return text + "\n"


def render_mixed(bench_csv: Path | None) -> str:
    """A mixed step (decodes + a prefill chunk) beside its decodes alone and its chunk alone (``latency.csv``)."""
    path = None if bench_csv is None else bench_csv.parent / "latency.csv"
    if path is None or not path.exists():
        return ""
    lat = pd.read_csv(path).set_index("what")
    if not {"mixed step", "its decodes alone", "its chunk alone"} <= set(lat.index):
        return ""
    mixed, dec, chunk = (lat.loc[k] for k in ("mixed step", "its decodes alone", "its chunk alone"))
    parts = dec.median_ms + chunk.median_ms
    return (
        f"A mixed step of {mixed.decodes:.0f} decodes at context {mixed.decode_context:.0f} and a "
        f"{mixed.new_tokens:.0f}-token first chunk takes {mixed.median_ms:.2f} ms; its decodes alone take "
        f"{dec.median_ms:.2f} ms and its chunk alone {chunk.median_ms:.2f} ms, {parts:.2f} ms together, so the "
        f"mixed step costs {mixed.median_ms / parts:.2f} of its parts run one after the other. The host needs "
        f"{mixed.host_ms:.2f} ms to build and launch it ({dec.host_ms:.2f} ms and {chunk.host_ms:.2f} ms for the "
        "parts).\n"
    )


def render_e2e(bench_csv: Path | None) -> str:
    """One request's wall time per token beside the captured forward alone, with async scheduling on and off."""
    rows = bench_rows(bench_csv)
    e2e, ratio, sync = (rows.get(k) for k in ("e2e_ms_per_token_b1", "e2e_over_forward_b1", "e2e_ms_per_token_b1_sync"))
    if e2e is None or num(e2e) is None:
        return ""
    model = e2e["note"].split(",", 1)[0]
    forward = num(e2e, "roofline_bound")
    text = (
        f"On {code(model)}, one request generates a token every {num(e2e):.3f} ms of wall time, against "
        f"{forward:.3f} ms for the captured forward alone: {num(e2e) / forward:.2f}×"
    )
    goal = None if ratio is None else Goal.parse(ratio.get("goal", ""))
    text += f" (goal {goal}; {goal.outcome(num(ratio), 'x')})." if goal else "."
    overlapped = re.search(r"(\d+) of (\d+) steps overlapped", e2e["note"])
    if overlapped:
        text += f" {overlapped.group(1)} of its {overlapped.group(2)} steps overlapped the host's work with the GPU's."
    if sync is not None and num(sync) is not None:
        text += (
            f" With async scheduling off, the same request takes {num(sync):.3f} ms a token "
            f"({num(sync) / forward:.2f}× the forward): the host builds each step only after reading the last one's "
            "tokens, and the GPU waits."
        )
    return text + "\n"


def render_exactness_trained(bench_csv: Path | None, model: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> str:
    """How often bf16 greedy decoding on a trained model agrees with HF's for every step, per engine variant."""
    path = None if bench_csv is None else bench_csv.parent / "exactness.csv"
    if path is None or not path.exists():
        return ""
    d = pd.read_csv(path)
    d = d[d["model"] == model]
    if d.empty:
        return ""
    parts = []
    for engine, g in d.groupby("engine", sort=False):
        steps = int(g["steps"].iloc[0])
        alone = ""
        if "alone_agree" in g:  # runs since the bench decodes each prompt alone too (the batch-1 path)
            alone = f" ({int((g['alone_agree'] == steps).sum())} of {len(g)} decoded alone, at batch 1)"
        parts.append(
            f"with the engine's {code(engine)}, {int(g['all_agree'].sum())} of {len(g)} prompts agree with HF "
            f"for all {steps} greedy steps{alone} and the teacher-forced argmax agrees on "
            f"{g['tf_argmax_agree_frac'].mean():.3f} of the positions"
        )
    return f"On {code(model)}'s trained weights in bf16, " + "; ".join(parts) + ".\n"
